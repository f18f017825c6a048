"""``training.micro_batch_size`` with TINY_GRPO_OVERRIDES's row-mean losses (``grpo``, ``dr_grpo``): each chunk's
loss is weighted by its share of the step's rows, its token-mean metrics (the clip fractions) by its share of the
completion tokens. The case is built so that neither equal chunk weights (the chunks have 3, 3, 3, 3, 3 and 1
rows) nor the other share (the completions differ in length) give the same gradient or metrics; the engine's
log-probs are shifted by +-0.3 so the ratio leaves the clip range and the clip fractions are not 0."""

from __future__ import annotations

import pytest

from refexp.record.metrics import read_metrics
from refexp.run import run
from tests.helpers.configs import TINY_GRPO_OVERRIDES, compose_tiny_run
from tests.helpers.engine_recording import by_row_parity, shift_behaviour_logprobs
from tests.helpers.grad_recording import largest, largest_difference, record_grpo_grads
from tests.helpers.runs import assert_same_row

pytestmark = pytest.mark.numerics  # tests/README.md: run under other CPU kernels too

MICRO = 3
RUN = [*TINY_GRPO_OVERRIDES, "training.steps=1", "eval.every=1", "eval.log_samples=0", "algo.share_prompt=false",
       "reference=fixed", "algo.beta=0.1"]


def _step_1(run_dir) -> dict:
    row = next(r for r in read_metrics(run_dir) if r["step"] == 1)
    return {k: v for k, v in row.items() if not k.startswith(("perf/", "mem/"))}


@pytest.mark.slow
@pytest.mark.parametrize("loss_agg", ["grpo", "dr_grpo"])
def test_row_mean_losses_weigh_each_chunk_by_its_rows(tmp_path, dense_reward, monkeypatch, loss_agg):
    grads = record_grpo_grads(monkeypatch)
    rollouts, _ = shift_behaviour_logprobs(monkeypatch, by_row_parity(0.3, -0.3))
    base = [*RUN, f"algo.loss_agg={loss_agg}"]
    run(compose_tiny_run(tmp_path / "whole", *base))
    run(compose_tiny_run(tmp_path / "micro", *base, f"training.micro_batch_size={MICRO}"))

    # the case tells the weightings apart: unequal chunks, and token shares that are not row shares
    mask = rollouts[0].rollout.mask_BT
    n = mask.shape[0]
    starts = range(0, n, MICRO)
    assert len({min(MICRO, n - s) for s in starts}) > 1
    token_share = [float(mask[s:s + MICRO].sum() / mask.sum()) for s in starts]
    row_share = [min(MICRO, n - s) / n for s in starts]
    assert max(abs(t - r) for t, r in zip(token_share, row_share)) > 0.01, "completions of one length"
    assert rollouts[1].rollout.mask_BT.equal(mask)  # both runs trained on the same rollout

    whole, micro = grads
    assert largest(whole) > 0
    assert largest_difference(micro, whole) <= 1e-5 * largest(whole)
    got, want = _step_1(tmp_path / "micro"), _step_1(tmp_path / "whole")
    assert 0 < want["clip/ratio"] < 1
    # chunks sum in another order: a clip bound at a tie may count a token apart (clip/ratio is thresholded)
    assert_same_row(got, want, other_order=True, where="the micro-batched step vs the whole")
