"""Reward functions named by dotted path in tests (``task.reward=tests.helpers.rewards:by_length``)."""


def by_length(completion: str, answer: str) -> float:
    """The completion's length in characters: a reward whose scale no built-in reward has."""
    return float(len(completion))


def raises(completion: str, answer: str) -> float:
    raise KeyError("boom")


def one_argument(completion: str) -> float:
    return 0.0


NOT_CALLABLE = 3


_training_calls = {"n": 0}


def fails_on_rank1_at_step2(completion: str, answer: str) -> float:
    """0, except on rank 1 in GRPO's second training step, where it raises: one rank failing mid-run
    while the others wait in a collective. Rollout scoring is told apart from held-out scoring by its
    caller (refexp/algos/grpo.py); ``REFEXP_TEST_FAIL_AFTER`` is the rank's rollouts per step."""
    import os
    import traceback

    stack = traceback.extract_stack()
    scorer = next((stack[i - 1] for i in range(len(stack) - 1, 0, -1) if stack[i].name == "score"), None)
    if os.environ.get("RANK") != "1" or scorer is None or not scorer.filename.endswith("algos/grpo.py"):
        return 0.0
    _training_calls["n"] += 1
    if _training_calls["n"] > int(os.environ.get("REFEXP_TEST_FAIL_AFTER", "8")):
        raise RuntimeError("injected failure on rank 1")
    return 0.0
