"""What the SFT stage teaches beyond the RL reward, and what evaluation measures of it: ``task.ops`` (every skill
SFT learns) against ``task.rl_ops`` (the skills RL prompts come from), ``eval/retention`` on the others, and
``eval/pass_at_k`` (Chen et al. 2021's unbiased estimator)."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from refexp.components.evaluation import kl_influence, pass_at_k
from refexp.config import ConfigError, TaskConfig, to_object
from refexp.tasks import build_task, task_fingerprint
from tests.helpers.configs import compose_root

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("override, message", [
    ("task.rl_ops=[-]", r"task\.rl_ops=\['-'\] is invalid: expected a subset of task\.ops=\['\+'\]"),
    ("task.rl_ops=[/]", r"task\.rl_ops\[\]='/' is invalid: expected one of \+, -, \*"),
    ("task.rl_ops=[]", r"task\.rl_ops=\[\] is invalid: expected a non-empty list"),
])
def test_rl_skills_outside_the_taught_ones_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        to_object(compose_root("algo=grpo", "task.ops=[+]", override))


def test_the_default_task_teaches_subtraction_that_rl_does_not_train():
    cfg = TaskConfig()
    assert (cfg.ops, cfg.rl_ops, cfg.retained_ops()) == (["+", "-"], ["+"], ["-"])
    assert TaskConfig(ops=["+", "-"], rl_ops=["+", "-"]).retained_ops() == []


def test_rl_reads_its_skills_and_sft_and_retention_read_the_rest(tmp_path):
    task = build_task(TaskConfig(num_train=2000, num_eval=200, demo_slip=0.85), str(tmp_path))
    op = lambda rows: {p[3] for p in rows["prompt"]}  # noqa: E731  ("042+317=": the operator after 3 digits)
    assert op(task.train) == op(task.eval) == op(task.val) == {"+"}
    assert op(task.retain_eval) == op(task.retain_val) == {"-"}
    assert op(task.demonstrations) == op(task.sft_validation) == {"+", "-"}
    # every row of the held-out / validation / training split is in exactly one of the RL and retained parts
    everything = build_task(TaskConfig(num_train=2000, num_eval=200, demo_slip=0.85, rl_ops=["+", "-"]),
                            str(tmp_path))
    assert everything.retain_eval is None and everything.sft_train is None
    assert sorted([*task.eval["prompt"], *task.retain_eval["prompt"]]) == sorted(everything.eval["prompt"])
    assert sorted([*task.val["prompt"], *task.retain_val["prompt"]]) == sorted(everything.val["prompt"])
    assert sorted(task.train["prompt"]) == sorted(p for p in everything.train["prompt"] if p[3] == "+")
    # SFT sees the same data either way
    assert list(task.demonstrations["completion"]) == list(everything.train["completion"])
    assert len(task.retain_eval) == 100 and all(int(a) >= 0 for a in task.retain_eval["answer"])


def test_the_cache_keys_hold_the_skills():
    """The SFT model is a function of what it is taught (``task.ops``); the RL prompts, DPO's pairs and the start's
    recorded accuracies of which skills RL trains (``task.rl_ops``)."""
    keys = {task_fingerprint(TaskConfig(ops=ops, rl_ops=rl)) for ops, rl in
            ((["+"], ["+"]), (["+", "-"], ["+"]), (["+", "-"], ["-"]), (["+", "-"], ["+", "-"]), (["+", "*"], ["+"]))}
    assert len(keys) == 5
    assert task_fingerprint(TaskConfig(ops=["+"], rl_ops=["+"])) == task_fingerprint(TaskConfig(ops=["+"]))


def _pass_at_k_by_enumeration(n: int, c: int, k: int) -> float:
    """The share of the k-subsets of n samples (c of them correct) that hold a correct one, counted."""
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n, c, k", [(8, 0, 8), (8, 1, 8), (8, 3, 1), (10, 2, 3), (10, 7, 4), (12, 5, 5), (6, 6, 2)])
def test_pass_at_k_is_the_share_of_k_subsets_with_a_correct_sample(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(_pass_at_k_by_enumeration(n, c, k), abs=1e-12)
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_1_is_the_share_correct_and_bad_counts_are_refused():
    assert pass_at_k(20, 5, 1) == pytest.approx(0.25)
    for n, c, k in ((4, 1, 5), (4, 5, 2), (4, 1, 0)):
        with pytest.raises(ValueError, match="pass@k needs"):
            pass_at_k(n, c, k)


@pytest.mark.parametrize("override, field", [("eval.pass_k=-1", "eval.pass_k"),
                                             ("eval.pass_k_samples=4", "eval.pass_k_samples"),
                                             ("eval.pass_k_prompts=0", "eval.pass_k_prompts")])
def test_bad_pass_k_settings_name_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        to_object(compose_root("algo=grpo", override))


@pytest.mark.slow
def test_kl_influence_averages_to_the_token_weighted_kl_and_resamples_like_it():
    """Each prompt's linearised contribution: their mean is sum(kl) / sum(tokens), and over 256 prompts the spread
    of a resample's mean is the spread of the resampled ratio itself (to first order, within 5%)."""
    kl, tokens = [1.0, 4.0, 0.5, 2.5], [2.0, 4.0, 1.0, 3.0]
    scores = kl_influence(kl, tokens)
    assert sum(scores) / len(scores) == pytest.approx(sum(kl) / sum(tokens))
    assert kl_influence([0.3, 0.6], [3.0, 3.0]) == pytest.approx([0.1, 0.2])  # equal lengths: each prompt's own KL
    assert kl_influence([], []) == []
    rng = np.random.default_rng(0)
    tok = rng.integers(5, 40, size=256).astype(float)
    kl = tok * rng.gamma(2.0, 0.05, size=256) * (1 + tok / 40)  # longer completions drift more per token
    scores = np.array(kl_influence(kl.tolist(), tok.tolist()))
    draws = rng.integers(0, 256, size=(4000, 256))
    exact = kl[draws].sum(1) / tok[draws].sum(1)
    assert scores[draws].mean(1).std() == pytest.approx(exact.std(), rel=0.05)


def test_debug_fast_logs_retention_and_pass_at_k_with_per_prompt_outcomes(tmp_path):
    run_dir = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "refexp", "algo=grpo", "debug=fast", "training.num_threads=1",
                          "eval.pass_k=2", "eval.pass_k_samples=4", "eval.pass_k_prompts=6",
                          f"sft.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={run_dir}"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 1, 2, 3]
    assert all({"eval/retention", "val/retention", "eval/pass_at_k", "kl/init_retain"} <= set(r) for r in evals)
    outcomes = [json.loads(line) for line in (run_dir / "eval_outcomes.jsonl").read_text().splitlines()]
    by_metric = {(o["step"], o["metric"]): o for o in outcomes}
    for r in evals:
        for metric, split, n in (("eval/retention", "retain_eval", 16), ("eval/pass_at_k", "eval", 6),
                                 ("kl/init", "eval", 8), ("kl/init_retain", "retain_eval", 8)):
            o = by_metric[(r["step"], metric)]
            assert o["split"] == split and o["prompt_ids"] == list(range(n))
            assert sum(o["scores"]) / n == pytest.approx(r[metric], abs=1e-9)
        # pass@2 of 4 samples takes the values 1 - C(4-c, 2)/C(4, 2): 0, 1/2, 5/6, 1
        assert all(min(abs(s - v) for v in (0, 0.5, 5 / 6, 1)) < 1e-9 for s in by_metric[(r["step"],
                                                                                           "eval/pass_at_k")]["scores"])
