"""The data order across epoch boundaries (``refexp.components.data_order``): each epoch a fresh seeded permutation of
every row, the steps reading consecutive slices of the concatenated epochs. The reference order here is
built from that documented rule alone, not from ``batch_ids``."""

from __future__ import annotations

import pytest
import torch

from refexp.components.data_order import batch_ids
from refexp.record.metrics import read_metrics
from refexp.run import run
from tests.helpers.configs import TINY_GRPO_OVERRIDES, compose_tiny_run
from tests.helpers.engine_recording import record_training_rollouts


def epoch_permutation(n: int, seed: int, epoch: int) -> list[int]:
    """Epoch ``epoch``'s order as the ``batch_ids`` docstring states it."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)).tolist()


def documented_stream(n: int, seed: int, epochs: int) -> list[int]:
    return [i for e in range(epochs) for i in epoch_permutation(n, seed, e)]


@pytest.mark.parametrize("n,batch_size", [(10, 4), (7, 3), (5, 12)])
def test_steps_read_consecutive_slices_of_fresh_permutations_across_epochs(n, batch_size):
    """Steps 1..k cover the concatenated epochs in order, the straddling steps (and a batch larger than the
    data set, which spans several epochs) included; every epoch is a permutation of all ids and no two
    consecutive epochs share an order."""
    seed, steps = 3, 8
    got = [i for s in range(1, steps + 1) for i in batch_ids(n, batch_size, seed, s)]
    epochs = -(-steps * batch_size // n)
    stream = documented_stream(n, seed, epochs)
    assert got == stream[:steps * batch_size]
    for e in range(epochs - 1):
        epoch = got[e * n:(e + 1) * n]
        assert sorted(epoch) == list(range(n)), f"epoch {e} is not a permutation"
        assert epoch != got[(e + 1) * n:(e + 2) * n], f"epochs {e} and {e + 1} share an order"


def test_the_step_that_straddles_an_epoch_ends_epoch_0_and_starts_epoch_1():
    n, seed = 10, 0
    first, second = epoch_permutation(n, seed, 0), epoch_permutation(n, seed, 1)
    assert first != second
    # positions 8..11: the last two of epoch 0, the first two of epoch 1
    assert batch_ids(n, 4, seed, 3) == first[8:] + second[:2]
    assert batch_ids(n, 4, seed + 1, 3) != batch_ids(n, 4, seed, 3)  # keyed by the seed


@pytest.mark.slow
def test_grpo_prompts_across_an_epoch_boundary_follow_the_documented_order(tmp_path, monkeypatch):
    """End to end: 6 training prompts (8 less 2 held out for validation), 4 a step, so step 2 reads epoch 0's
    last two and epoch 1's first two; the prompts the rollout engine receives are those rows of the train
    split, each repeated group_size times."""
    import refexp.tasks as tasks_mod

    tasks = []
    build = tasks_mod.build_task
    monkeypatch.setattr(tasks_mod, "build_task", lambda *a, **k: tasks.append(build(*a, **k)) or tasks[-1])
    rollouts = record_training_rollouts(monkeypatch)
    n, per_step, G, seed = 6, 4, 4, 0
    run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, "task.num_train=8", "task.ops=[+]", "task.val_fraction=0.25",
                         "training.steps=3", "eval.every=3", "eval.log_samples=0", f"training.seed={seed}"))
    assert [r["step"] for r in read_metrics(tmp_path) if r["step"] > 0] == [1, 2, 3]
    train = tasks[-1].train
    assert len(train) == n
    stream = documented_stream(n, seed, 2)
    assert [r.step for r in rollouts] == [1, 2, 3]
    for r in rollouts:
        want = stream[(r.step - 1) * per_step:r.step * per_step]
        assert r.prompt_ids == [i for i in want for _ in range(G)], f"step {r.step}"
        assert r.prompts == [train[i]["prompt"] for i in want for _ in range(G)], f"step {r.step}"
