"""Reward functions named by dotted path in tests (``task.reward=tests.rewards_for_tests:by_length``)."""


def by_length(completion: str, answer: str) -> float:
    """The completion's length in characters: a reward whose scale no built-in reward has."""
    return float(len(completion))


def raises(completion: str, answer: str) -> float:
    raise KeyError("boom")


def one_argument(completion: str) -> float:
    return 0.0


NOT_CALLABLE = 3
