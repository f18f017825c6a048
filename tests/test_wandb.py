"""What W&B receives, read back from the offline run files (``tests/helpers/wandb_records.py``): one group per
compared setting, job types that name the strategy (and DPO's loss), best accuracy as the summary, and
no step sent twice when a run resumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict

import pytest

from refexp.components.metric_logger import MetricLogger
from refexp.components.wandb_conventions import run_info
from refexp.config import LoggerConfig
from refexp.record.overrides import swept_keys
from refexp.record.status import read_status
from tests.helpers.configs import TINY_GRPO_OVERRIDES, TINY_RUN_OVERRIDES
from tests.helpers.wandb_records import read_offline_run


def test_run_info_groups_by_setting_not_by_seed():
    common = dict(experiment="cmp", algo="grpo", strategy="periodic_reset", task="arithmetic", loss_type=None,
                  sweep="2026-12-03_10-00-00")
    a = run_info(**common, overrides=["reference=periodic_reset", "reference.reset_every=20", "training.seed=0"])
    b = run_info(**common, overrides=["reference=periodic_reset", "reference.reset_every=20", "training.seed=1"])
    c = run_info(**common, overrides=["reference=periodic_reset", "reference.reset_every=50", "training.seed=0"])
    assert a["group"] == b["group"] == "cmp/2026-12-03_10-00-00/periodic_reset reference.reset_every=20"
    assert c["group"] != a["group"] and a["name"] != b["name"]
    assert a["job_type"] == "periodic_reset" and "sweep:2026-12-03_10-00-00" in a["tags"]
    assert a["sweep_id"] == "2026-12-03_10-00-00"


# Runs the real `refexp -m` app with run_from_hydra replaced by printing each job's W&B fields: the sweep's
# own Hydra runtime (multirun.yaml, the job's overrides), no training.
PRINT_RUN_INFO = """
import json, sys, types
from refexp.components.wandb_conventions import hydra_run_info
from refexp.config import to_object
fake_run = types.ModuleType("refexp.run")
fake_run.run_from_hydra = lambda cfg: print("RUN_INFO", json.dumps(hydra_run_info(to_object(cfg))))
sys.modules["refexp.run"] = fake_run
from refexp.__main__ import main
sys.argv[0] = "refexp"
main()
"""


@pytest.mark.parametrize("sweep, groups", [
    (["algo=grpo", "logger=wandb", "training.steps=2", "reference=fixed,none"],
     {"default/sweep/fixed", "default/sweep/none"}),
    (["experiment=quickstart", "logger=wandb", "hydra.sweeper.params.grpo_variant='fixed,none'",
      "~hydra.callbacks.report", "hydra/launcher=local"],  # jobs in this process, where run_from_hydra is replaced
     {"quickstart/sweep/fixed grpo_variant=fixed", "quickstart/sweep/none grpo_variant=none"}),
], ids=["command line", "sweeper params"])
def test_a_sweeps_groups_name_only_the_overrides_its_jobs_differ_by(tmp_path, sweep, groups):
    """``logger=wandb training.steps=2`` is shared by every job: no setting, so not in the group."""
    p = subprocess.run([sys.executable, "-c", PRINT_RUN_INFO, "-m", *sweep, f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    infos = [json.loads(line.split(" ", 1)[1]) for line in p.stdout.splitlines() if line.startswith("RUN_INFO ")]
    assert {info["group"] for info in infos} == groups and len(infos) == 2
    assert all("logger" not in info["name"] and "=" in info["name"] for info in infos)


def test_swept_keys_are_the_overrides_hydra_sweeps():
    overrides = ["logger=wandb", "reference=fixed,none", "+x=choice(5, 10)", "algo.beta=tag(log, interval(0.01, 2))"]
    assert swept_keys(overrides) == {"reference", "x", "algo.beta"}


def test_dpo_job_types_tell_the_variants_apart():
    def info(strategy, loss):
        return run_info(experiment="dpo", algo="dpo", strategy=strategy, task="arithmetic", loss_type=loss,
                        overrides=[], sweep="s")

    types = {info("periodic_reset", "sigmoid")["job_type"], info("none", "simpo")["job_type"],
             info("none", "orpo")["job_type"]}
    assert types == {"periodic_reset:sigmoid", "none:simpo", "none:orpo"}
    assert "loss:orpo" in info("none", "orpo")["tags"]
    assert run_info(experiment="e", algo="grpo", strategy="ema", task="t", loss_type=None, overrides=[],
                    sweep=None, group="mine")["group"] == "mine"


def _offline_runs(root):
    return [read_offline_run(f) for f in sorted(root.rglob("run-*.wandb"))]


def test_a_resumed_run_does_not_send_its_replayed_steps_again(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = LoggerConfig(name="wandb", project="refexp-test")
    first = MetricLogger(tmp_path, wandb_cfg=cfg, run_info={"group": "g", "job_type": "fixed"})
    for step in range(4):
        first.log({"eval/accuracy": 0.1 * step}, step=step)
    first.close(1)  # killed after step 3; the last checkpoint was step 1
    second = MetricLogger(tmp_path, wandb_cfg=cfg, run_info={"group": "g", "job_type": "fixed"})
    second.truncate_after(1)
    for step in range(2, 6):
        second.log({"eval/accuracy": 0.1 * step}, step=step)
    second.close()
    steps = [row["step"] for run in _offline_runs(tmp_path) for row in run.history if "step" in row]
    assert sorted(steps) == [0, 1, 2, 3, 4, 5]  # each step once, over both attempts
    assert len({f.parent.name for f in tmp_path.rglob("run-*.wandb")}) == 2  # both attempts, one run id
    assert (tmp_path / "wandb_id").read_text() in {f.stem.split("-", 1)[1] for f in tmp_path.rglob("run-*.wandb")}


@pytest.mark.slow
def test_an_offline_sweep_shows_one_group_per_strategy_with_best_accuracy_summaries(tmp_path):
    sweep = tmp_path / "sweep"
    env = {**os.environ, "WANDB_MODE": "offline"}
    cmd = [sys.executable, "-m", "refexp", "-m", *TINY_RUN_OVERRIDES, *TINY_GRPO_OVERRIDES, "training.steps=2",
           "logger=wandb", "reference=fixed,none", "training.seed=0,1", f"hydra.sweep.dir={sweep}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    runs = _offline_runs(sweep)
    assert len(runs) == 4
    groups = defaultdict(list)
    for run in runs:
        groups[run.group].append(run)
    assert sorted(len(v) for v in groups.values()) == [2, 2], list(groups)
    for members in groups.values():
        assert len({r.job_type for r in members}) == 1
        assert {t for t in members[0].tags if t.startswith("ref:")} == {f"ref:{members[0].job_type}"}
    assert {r.job_type for r in runs} == {"fixed", "none"}
    for run in runs:
        assert run.metric_summaries["eval/accuracy"] == "max" and run.metric_summaries["kl/init"] == "last"
        accs = [row["eval/accuracy"] for row in run.history if "eval/accuracy" in row]
        assert run.summary["eval/accuracy"] == {"max": max(accs)}
        assert run.config["sweep_id"] == "sweep"
        assert any(row.get("samples/eval/_type") == "table-file" for row in run.history)  # a completions table


def test_the_sweep_workspace_is_built_offline_with_its_sections_and_grouping(tmp_path, capsys):
    import json

    from refexp.report import build_report
    from refexp.report.__main__ import main
    from tests.helpers.report_sweep import make_sweep

    make_sweep(tmp_path)
    # no API key: the spec is written
    assert main([str(tmp_path), "--quiet", "--wandb-workspace", "--baseline", "fixed"]) == 0
    assert "W&B workspace:" in capsys.readouterr().out
    spec = json.loads((tmp_path / "wandb_workspace.json").read_text())
    (runset,) = spec["spec"]["section"]["runSets"]
    assert runset["grouping"] == [{"section": "run", "name": "group"}]  # one line per compared setting
    (tag_filter,) = runset["filters"]["filters"]
    assert tag_filter["key"]["name"] == "tags" and tag_filter["value"] == [f"sweep:{tmp_path.name}"]
    sections = {s["name"]: s for s in spec["spec"]["section"]["panelBankConfig"]["sections"]}
    assert list(sections) == ["Accuracy and drift", "Reference events", "Rewards", "Cost"]
    metrics = {name: [m for p in s["panels"] for m in p["config"].get("metrics", [])] for name, s in sections.items()}
    assert metrics["Accuracy and drift"] == ["eval/accuracy", "kl/init"]  # eval/pref_accuracy: never logged here
    assert metrics["Reference events"] == ["ref/version", "kl/ref"]
    assert "perf/ref_fwd_s" in metrics["Cost"] and "mem/peak_gpu_mb" not in metrics["Cost"]
    scatter = [p for p in sections["Accuracy and drift"]["panels"] if p["viewType"] == "Scatter Plot"]
    assert len(scatter) == 1
    lines = [p for s in sections.values() for p in s["panels"] if p["viewType"] == "Run History Line Plot"]
    assert all(p["config"]["xAxis"] == "step" and p["config"]["groupAgg"] == "mean" for p in lines)
    report = build_report(tmp_path)
    assert report.runs  # the spec did not disturb the sweep


def test_evaluations_and_rollouts_leave_readable_samples(tmp_path, monkeypatch):
    """samples.jsonl and the W&B tables: greedy held-out completions at every evaluation, GRPO rollouts
    on the evaluation schedule; never in metrics.jsonl or the final numbers."""
    import json

    from refexp.record.metrics import read_metrics
    from refexp.record.samples import read_samples
    from refexp.run import run
    from tests.helpers.configs import compose_tiny_run

    monkeypatch.setenv("WANDB_MODE", "offline")
    final = run(compose_tiny_run(tmp_path, *TINY_GRPO_OVERRIDES, "training.steps=2", "eval.every=2",
                                 "eval.log_samples=3", "logger=wandb"))
    rows = read_samples(tmp_path)
    by_kind = defaultdict(list)
    for r in rows:
        by_kind[(r["kind"], r["step"])].append(r)
    assert sorted(by_kind) == [("eval", 0), ("eval", 2), ("rollout", 2)]
    assert all(len(v) == 3 for v in by_kind.values())
    first = by_kind[("eval", 2)][0]
    assert set(first) == {"step", "kind", "prompt", "completion", "answer", "reward"} and first["prompt"]
    assert {"advantage"} <= set(by_kind[("rollout", 2)][0])
    assert not any(k.startswith("samples/") for r in read_metrics(tmp_path) for k in r)
    assert not any(k.startswith("samples/") for k in final)
    assert "samples" not in json.dumps(read_status(tmp_path)["final"])
    (run_file,) = tmp_path.rglob("run-*.wandb")
    logged = read_offline_run(run_file)
    tables = [row for row in logged.history if "samples/eval/_type" in row or "samples/eval" in row]
    assert len(tables) == 2  # one completions table per evaluation


def test_the_continued_sft_baseline_is_its_config_name_in_w_and_b():
    """``grpo_variant=continued_sft``: W&B's job type is the config's ``algo.objective`` (and the report's label),
    ``continued_sft``; GRPO has no loss type, so no ``loss:`` tag."""
    from refexp.components.wandb_conventions import hydra_run_info
    from refexp.config import to_object
    from tests.helpers.configs import compose_root

    cfg = to_object(compose_root("grpo_variant=continued_sft"))
    info = hydra_run_info(cfg)
    assert cfg.algo.objective == info["job_type"] == "continued_sft"
    assert info["group"].endswith("continued_sft") and not any(t.startswith("loss:") for t in info["tags"])
