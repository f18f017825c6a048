"""The reward model's held-out accuracy with a 95% interval whose unit is the prompt.

The held-out samples are ``rm.samples_per_prompt`` completions of each held-out prompt, and completions of one
prompt are not independent: they share its difficulty (an easy sum is right in most samples, and the reward model
is right or wrong about a prompt's samples together). A binomial interval over samples would treat n prompts x m
samples as n·m independent draws and be too narrow by the design effect 1 + (m − 1)ρ, ρ the intra-prompt
correlation (Kish 1965, "Survey Sampling", §5.4; Donner & Klar 2000, "Design and Analysis of Cluster Randomization
Trials", §2). The prompts are a random draw of the task's training prompts (``refexp/algos/rm_sources.py``), so
each prompt's mean accuracy is one independent observation, and the interval is Student's t over those means.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Hashable, Optional, Sequence

import numpy as np
from scipy.stats import t as student_t


def per_prompt_means(correct: Sequence[bool | float], prompt_ids: Sequence[Hashable]) -> list[float]:
    """The mean of ``correct`` over each prompt's samples, prompts in order of first appearance.

    correct:    [N] 1/True where the reward model's sign agreed with the label
    prompt_ids: [N] the prompt each sample belongs to
    """
    if len(correct) != len(prompt_ids):
        raise ValueError(f"{len(correct)} outcomes for {len(prompt_ids)} prompt ids")
    groups: dict[Hashable, list[float]] = defaultdict(list)
    for c, p in zip(correct, prompt_ids):
        groups[p].append(float(c))
    return [float(np.mean(v)) for v in groups.values()]


def prompt_interval(correct: Sequence[bool | float], prompt_ids: Sequence[Hashable], confidence: float = 0.95
                    ) -> dict:
    """``{"accuracy", "interval", "prompts", "samples"}``: the mean over prompts of each prompt's accuracy and the
    Student-t interval mean ± t_{(1+c)/2, n−1}·s/√n over those n means (s their standard deviation, ddof 1),
    clipped to [0, 1]; ``interval`` is None with one prompt (no spread to measure). With the same number of
    samples per prompt (as the stage draws them) the accuracy is the share of samples right."""
    means = per_prompt_means(correct, prompt_ids)
    n = len(means)
    if n == 0:
        raise ValueError("no held-out samples")
    mean = float(np.mean(means))
    interval: Optional[list[float]] = None
    if n > 1:
        half = float(student_t.ppf((1 + confidence) / 2, n - 1)) * float(np.std(means, ddof=1)) / math.sqrt(n)
        interval = [max(0.0, mean - half), min(1.0, mean + half)]
    return {"accuracy": mean, "interval": interval, "prompts": n, "samples": len(correct)}
