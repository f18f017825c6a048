"""The reward model's ranking of completions of one prompt: the within-prompt pairs, their held-out accuracy, and
the Bradley-Terry loss on them (``rm.loss=pairwise``).

Why the ranking within a prompt is what matters to GRPO: its advantage is the reward normalised within the group of
completions of one prompt, Â_i = (r_i − mean(r)) / std(r) (Shao et al. 2024, "DeepSeekMath", §4.1.2, outcome
supervision; ``group_advantages`` in ``refexp/losses/grpo.py``), so a constant added to every completion of a prompt
changes nothing, and what the policy follows is only the order the reward model puts one prompt's completions in. A
pointwise proxy (binary cross-entropy on the verifier's labels, ``rm.loss=bce``) can reach a high label accuracy
across prompts by recognising which prompts are hard (many prompts' samples are all right or all wrong) while
ordering the completions of one prompt near chance. ``pair_accuracy`` measures that order: over every (right, wrong)
pair of completions of the same held-out prompt, the share the reward model scores in the right order, ties counted
1/2 — per prompt the Mann-Whitney U statistic over n_right·n_wrong (the AUC), pooled over prompts by their pairs.

The pairwise loss trains that order directly: −log σ(r_right − r_wrong) over the same pairs, the Bradley-Terry
likelihood of InstructGPT's reward model (Ouyang et al. 2022, "Training language models to follow instructions with
human feedback", eq. 1; TRL's ``RewardTrainer``), the reward then the score itself.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Hashable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import mannwhitneyu
from scipy.stats import t as student_t


def is_right(label: float) -> bool:
    """A verifier label counts as right above 1/2 (as the held-out label accuracy reads it)."""
    return float(label) > 0.5


def by_prompt(values: Sequence, labels: Sequence[float], prompt_ids: Sequence[Hashable]
              ) -> dict[Hashable, tuple[list, list]]:
    """prompt -> (the ``values`` of its right samples, those of its wrong ones), prompts in order of first
    appearance (``values``, ``labels`` and ``prompt_ids`` [N] each)."""
    groups: dict[Hashable, tuple[list, list]] = defaultdict(lambda: ([], []))
    for v, y, p in zip(values, labels, prompt_ids):
        groups[p][0 if is_right(y) else 1].append(v)
    return groups


def pair_index(labels: Sequence[float], prompt_ids: Sequence[Hashable]) -> tuple[torch.Tensor, torch.Tensor]:
    """(right [P], wrong [P]) long tensors: the indices into ``labels`` [N] of every (right, wrong) pair of samples of
    the same prompt, P = Σ over prompts of n_right·n_wrong."""
    groups = by_prompt(range(len(labels)), labels, prompt_ids)
    right = [r for rs, ws in groups.values() for r in rs for _ in ws]
    wrong = [w for rs, ws in groups.values() for _ in rs for w in ws]
    return torch.tensor(right, dtype=torch.long), torch.tensor(wrong, dtype=torch.long)


def pairwise_loss(scores: torch.Tensor, right: torch.Tensor, wrong: torch.Tensor) -> torch.Tensor:
    """The mean over the pairs of −log σ(scores[right] − scores[wrong]) (Bradley-Terry; scores [N], right/wrong [P],
    P > 0)."""
    return -F.logsigmoid(scores[right] - scores[wrong]).mean()


def pair_accuracy(scores: Sequence[float], labels: Sequence[float], prompt_ids: Sequence[Hashable],
                  confidence: float = 0.95) -> dict:
    """``{"accuracy", "interval", "pairs", "prompts"}``: the share of within-prompt (right, wrong) pairs that
    ``scores`` [N] put in the right order (ties 1/2), over the ``prompts`` that have both a right and a wrong sample
    (``pairs`` of them in all); ``accuracy`` is None when no prompt has a pair. ``interval``: its Student-t interval
    with the prompt as the unit (``ratio_interval``), None with fewer than 2 prompts."""
    if not len(scores) == len(labels) == len(prompt_ids):
        raise ValueError(f"{len(scores)} scores, {len(labels)} labels and {len(prompt_ids)} prompt ids")
    ordered, sizes = [], []
    for rs, ws in by_prompt([float(x) for x in scores], labels, prompt_ids).values():
        if rs and ws:  # U of the right scores against the wrong: pairs with right > wrong, plus half the ties
            ordered.append(float(mannwhitneyu(np.array(rs), np.array(ws), method="asymptotic").statistic))
            sizes.append(len(rs) * len(ws))
    pairs = sum(sizes)
    return {"accuracy": sum(ordered) / pairs if pairs else None,
            "interval": ratio_interval(ordered, sizes, confidence), "pairs": int(pairs), "prompts": len(sizes)}


def ratio_interval(ordered: Sequence[float], sizes: Sequence[int], confidence: float = 0.95
                   ) -> Optional[list[float]]:
    """The Student-t interval, clipped to [0, 1], of R = Σ u_p / Σ n_p over k prompts (u_p the pairs prompt p puts
    in order, n_p its pairs): the prompts are the independent units (a scorer is right or wrong about one prompt's
    pairs together) and R is a ratio of their sums, so its standard error is the ratio (linearisation) estimator's,
    se² = Σ (u_p − R n_p)² / ((k − 1) k n̄²) with n̄ the mean n_p (Cochran 1977, "Sampling Techniques", eq. 6.13),
    with t on k − 1 degrees of freedom. None with fewer than 2 prompts."""
    k = len(sizes)
    if k < 2:
        return None
    u, n = np.asarray(ordered, dtype=float), np.asarray(sizes, dtype=float)
    ratio = u.sum() / n.sum()
    se = math.sqrt(float(((u - ratio * n) ** 2).sum()) / ((k - 1) * k * n.mean() ** 2))
    half = float(student_t.ppf((1 + confidence) / 2, k - 1)) * se
    return [max(0.0, ratio - half), min(1.0, ratio + half)]
