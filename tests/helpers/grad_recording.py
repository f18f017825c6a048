"""What a GRPO step hands to the optimizer: every update's gradients, by parameter name, recorded by wrapping
``optimizer_step`` where the step calls it (so a difference cannot hide in a logged metric)."""

from __future__ import annotations

import torch


def record_grpo_grads(monkeypatch) -> list[dict[str, torch.Tensor]]:
    """Installs the recorder for the rest of the test; the returned list fills with one dict per update."""
    import refexp.algos.grpo as grpo_mod

    steps: list[dict[str, torch.Tensor]] = []
    original = grpo_mod.optimizer_step

    def record(ctx, policy, loss, step, ckpt):
        steps.append({n: p.grad.detach().clone() for n, p in policy.model.named_parameters()})
        return original(ctx, policy, loss, step, ckpt)

    monkeypatch.setattr(grpo_mod, "optimizer_step", record)
    return steps


def largest(grads: dict[str, torch.Tensor]) -> float:
    """The largest absolute gradient entry (the scale a difference is measured against)."""
    return max(float(g.abs().max()) for g in grads.values())


def largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)
