"""The reward model's within-prompt ranking (refexp/algos/rm_pairs.py): the held-out pair accuracy and the
Bradley-Terry loss by hand, ``rm.loss=pairwise`` refused without pairs to train on and kept apart in the cache key,
and a tiny ``rm.loss=pairwise`` run whose held-out pair accuracy rises and is recorded in ``rm.json``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import refexp.algos.rm as rm_module
from refexp.algos.rm_pairs import pair_accuracy, pair_index, pairwise_loss
from refexp.config import ConfigError
from refexp.config.root import to_object
from refexp.record.metrics import read_metrics
from refexp.run import run
from tests.helpers.configs import compose_root, compose_small_run
from tests.test_rm_sources import _fingerprint

pytest.importorskip("transformers")


def test_the_pair_accuracy_is_the_share_of_within_prompt_pairs_in_order_ties_half():
    # prompt a: right 2.0 and 0.0, wrong 1.0 -> (2 > 1) in order, (0 < 1) not: 1 of 2
    # prompt b: right 1.0, wrong 1.0 and 0.0 -> a tie (1/2) and (1 > 0): 1.5 of 2
    # prompt c all right, d all wrong: no pairs; by hand (1 + 1.5) / 4 = 0.625 over 4 pairs of 2 prompts
    scores = [2.0, 1.0, 0.0, 1.0, 1.0, 0.0, 9.0, 8.0, -9.0]
    labels = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    prompts = ["a", "a", "a", "b", "b", "b", "c", "c", "d"]
    got = pair_accuracy(scores, labels, prompts)
    assert (got["accuracy"], got["pairs"], got["prompts"]) == (pytest.approx(0.625), 4, 2)
    # a scorer that knows only which prompt is easy gets every label's sign right and orders no pair
    easy = {"p": 3.0, "q": -3.0}
    prompts = ["p", "p", "p", "q", "q", "q"]
    labels = [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]  # p mostly right, q mostly wrong
    by_prompt = [easy[p] for p in prompts]
    assert sum((s > 0) == (y > 0.5) for s, y in zip(by_prompt, labels)) / 6 == pytest.approx(4 / 6)
    assert pair_accuracy(by_prompt, labels, prompts)["accuracy"] == pytest.approx(0.5)
    assert pair_accuracy([1.0, 2.0], [1.0, 1.0], ["a", "a"]) == {"accuracy": None, "interval": None, "pairs": 0,
                                                                 "prompts": 0}


def test_the_pair_accuracys_interval_takes_the_prompt_as_its_unit():
    # three prompts: u = (2, 0, 3) of n = (2, 2, 4) pairs in order -> R = 5/8; residuals u - R n = (0.75, -1.25, 0.5),
    # se^2 = (0.5625 + 1.5625 + 0.25) / (2 * 3 * (8/3)^2) = 2.375 / 42.667; t_{0.975, 2} = 4.3027
    # a: right 1 over wrong 0, 0 (2 of 2); b: right 0 under wrong 1, 1 (0 of 2); c: right 1, 3 over wrong 0, 2
    # (1 > 0, 3 > 0, 3 > 2: 3 of 4)
    scores = [1.0, 0.0, 0.0] + [0.0, 1.0, 1.0] + [1.0, 3.0, 0.0, 2.0]
    labels = [1.0, 0.0, 0.0] + [1.0, 0.0, 0.0] + [1.0, 1.0, 0.0, 0.0]
    prompts = ["a"] * 3 + ["b"] * 3 + ["c"] * 4
    got = pair_accuracy(scores, labels, prompts)
    assert (got["accuracy"], got["pairs"], got["prompts"]) == (pytest.approx(5 / 8), 8, 3)
    half = 4.302652729911275 * math.sqrt(2.375 / (2 * 3 * (8 / 3) ** 2))
    assert got["interval"] == [pytest.approx(max(0.0, 5 / 8 - half)), pytest.approx(min(1.0, 5 / 8 + half))]
    # the same pairs counted as independent would give a far narrower interval: the unit matters
    assert got["interval"][1] - got["interval"][0] > 0.5


def test_the_pairwise_loss_is_bradley_terry_over_the_within_prompt_pairs():
    labels, prompts = [1.0, 1.0, 0.0, 1.0], ["a", "a", "a", "b"]
    right, wrong = pair_index(labels, prompts)
    assert sorted(zip(right.tolist(), wrong.tolist())) == [(0, 2), (1, 2)]  # b has no wrong sample: no pair
    scores = torch.tensor([3.0, 0.0, 1.0, 5.0])
    # by hand: −log σ(3 − 1) = log(1 + e^−2) = 0.1269280, −log σ(0 − 1) = log(1 + e) = 1.3132617; mean 0.7200948
    assert float(pairwise_loss(scores, right, wrong)) == pytest.approx(0.7200948, abs=1e-6)
    assert float(pairwise_loss(scores + 7.0, right, wrong)) == pytest.approx(0.7200948, abs=1e-6)  # shift-free


def test_pairwise_without_two_samples_a_prompt_or_an_unknown_loss_is_one_error_naming_the_field():
    with pytest.raises(ConfigError, match=r"rm\.samples_per_prompt=1 is invalid: expected at least 2 with "
                                          r"rm\.loss=pairwise"):
        to_object(compose_root("rm.loss=pairwise", "rm.samples_per_prompt=1"))
    with pytest.raises(ConfigError, match=r"rm\.loss='hinge' is invalid: expected one of bce, pairwise"):
        to_object(compose_root("rm.loss=hinge"))
    to_object(compose_root("rm.samples_per_prompt=1"))  # bce reads each sample alone


def test_the_cache_key_changes_with_the_loss_and_bce_keeps_the_key_it_had(tmp_path):
    default = _fingerprint(tmp_path)
    assert _fingerprint(tmp_path, "rm.loss=bce") == default
    assert _fingerprint(tmp_path, "rm.loss=pairwise") != default


RM_PAIRWISE = ["algo=rm", "rm.loss=pairwise", "rm.num_samples=256", "rm.samples_per_prompt=8", "rm.steps=20",
               "rm.batch_size=32", "rm.eval_every=2", "rm.lr=1e-4", "rm.val_fraction=0.25"]


def test_a_tiny_pairwise_run_learns_to_order_completions_of_one_prompt(tmp_path, monkeypatch):
    # the labels are a feature of the text the reward model can learn in a few steps (the completion's last digit
    # even), so the test reads the training, not whether a tiny model can add
    monkeypatch.setenv("REFEXP_CACHE", str(tmp_path / "cache"))
    original = rm_module.labelled_samples

    def relabelled(ctx, sft_dir):
        train, val, per_source = original(ctx, sft_dir)
        for part in (train, val):
            part["labels"] = torch.tensor([float(c[-1:].isdigit() and int(c[-1]) % 2 == 0)
                                           for c in part["completions"]])
        return train, val, per_source

    monkeypatch.setattr(rm_module, "labelled_samples", relabelled)
    final = run(compose_small_run(tmp_path / "rm", *RM_PAIRWISE))
    rm_dir = Path(final["rm/dir"]).parent
    summary = json.loads((rm_dir / "rm.json").read_text())
    curve = [row["rm/val_pair_accuracy"] for row in read_metrics(rm_dir) if "rm/val_pair_accuracy" in row]
    assert summary["loss"] == "pairwise" and summary["val_pairs"] > 0 and summary["val_pair_prompts"] > 0
    assert summary["val_pair_accuracy"] == final["rm/val_pair_accuracy"]
    assert summary["val_pair_accuracy"] >= 0.8 > curve[0], curve
