"""What one rank of a configured job processes, for the memory plan (``refexp/cli/memory_plan.py``): the batches
the decode loop generates, and the chunk one training forward/backward holds with the positions its loss reads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainingChunk:
    """One training forward/backward on a rank: ``rows`` rows of ``length`` tokens, of which ``selected`` are the
    positions ``select_BT`` passes to the output layer (``titan.token_logprobs``), the ``what`` of the algorithm."""

    rows: int
    length: int
    selected: int
    what: str


def training_chunk(cfg, dp: int) -> TrainingChunk:
    """The chunk of ``training.micro_batch_size`` rows (or the whole step) on one of ``dp`` data-parallel ranks.
    Its selected positions are every usual row's completion budget: GRPO's sampled completions, DPO's chosen and
    rejected completions, SFT's demonstrations (``refexp/algos/grpo.py``, ``dpo.py``, ``sft.py``)."""
    a, task = cfg.algo, cfg.task
    completion = getattr(a, "max_new_tokens", None) or task.max_new_tokens
    prompt = task.max_prompt_len
    if a.name == "grpo":
        G = a.group_size
        rows = max(1, a.prompts_per_step * G // dp)
        chunk = min(rows, cfg.training.micro_batch_size or rows)
        what = "completion tokens"
        if a.share_prompt:  # a prompt's G completions in one row (refexp/algos/shared_prompt.py)
            shared = max(1, chunk // G)
            return TrainingChunk(shared, prompt + G * completion + G - 1, shared * G * completion, what)
        return TrainingChunk(chunk, prompt + completion, chunk * completion, what)
    if a.name == "dpo":
        pairs = max(1, a.pairs_per_step // dp)
        chunk = min(pairs, cfg.training.micro_batch_size or pairs)
        what = "chosen and rejected completion tokens"
        if a.share_prompt:
            return TrainingChunk(chunk, prompt + 2 * completion + 1, 2 * chunk * completion, what)
        return TrainingChunk(2 * chunk, prompt + completion, 2 * chunk * completion, what)
    rows = max(1, cfg.sft.batch_size // dp)  # SFT: the stage's own batch of demonstrations
    chunk = min(rows, cfg.training.micro_batch_size or rows)
    return TrainingChunk(chunk, prompt + completion, chunk * completion, "demonstration tokens")


@dataclass
class Generation:
    """One batch the decode loop generates on a rank: ``rows`` rows of ``length`` cache slots, prefilled
    from ``distinct`` prompts."""

    what: str
    rows: int
    length: int
    distinct: int


def generations(cfg, dp: int) -> list[Generation]:
    """The batches a rank decodes: the GRPO step's, and the evaluation's (``refexp/components/evaluation.py``: each rank
    its ``ceil(n / dp)`` prompts, in batches of at most ``EVAL_BATCH_SIZE`` rows; the drift's: ``drift_generation``)."""
    from refexp.components import evaluation

    a, task = cfg.algo, cfg.task
    out = []
    full = task.max_prompt_len + task.max_new_tokens
    if a.name == "grpo":
        rows = max(1, a.prompts_per_step * a.group_size // dp)
        out.append(Generation("the GRPO step's", rows, task.max_prompt_len + (a.max_new_tokens or task.max_new_tokens),
                              max(1, rows // a.group_size)))

    def per_rank(n: int) -> int:
        return min(evaluation.EVAL_BATCH_SIZE, -(-n // dp))

    if task.name != "preference":  # no reward: no eval/accuracy
        n = per_rank(cfg.eval.num_prompts)
        out.append(Generation("eval/accuracy's", n, full, n))
    out.append(drift_generation(cfg, dp))
    return out


def drift_generation(cfg, dp: int) -> Generation:
    """The drift measurement's largest batch on a rank (``evaluation.kl_to_anchor``): of its ``ceil(kl_prompts / dp)``
    prompts at most ``EVAL_BATCH_SIZE // eval.kl_samples`` at a time, each sampled ``eval.kl_samples`` times."""
    from refexp.components import evaluation

    samples = cfg.eval.kl_samples
    prompts = min(max(1, evaluation.EVAL_BATCH_SIZE // samples), -(-cfg.eval.kl_prompts // dp))
    return Generation("kl/init's", prompts * samples, cfg.task.max_prompt_len + cfg.task.max_new_tokens, prompts)
