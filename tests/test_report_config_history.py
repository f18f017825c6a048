"""The setup block's experiment config line: the experiment file's last commit in the report's checkout against when
the sweep's first run began and the runs' commit; a file changed after the first run began is flagged, with whether
its comparison block moved; without git the line says so and the report goes on."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess

import numpy as np
import yaml

from refexp.config import ComparisonConfig
from refexp.report import build_report
from refexp.report.reading.config_history import BLOCK_DEFAULTS, experiment_of, flat_fields, histories
from refexp.report.reading.load import load_sweep
from tests.helpers.primary_sweeps import PROMPTS, block, write_run

STARTED = 1_800_000_000.0
"""When the sweep's first run began (unix seconds; 2027-01-15T08:00:00Z)."""
DECL = block(["fixed", "ema"])


def git(repo, *args, at: float | None = None) -> str:
    env = os.environ | ({"GIT_AUTHOR_DATE": f"@{int(at)} +0000", "GIT_COMMITTER_DATE": f"@{int(at)} +0000"}
                        if at is not None else {})
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                          capture_output=True, text=True, env=env).stdout.strip()


def commit_experiment(repo, decl: dict, *, at: float, comment: str = "") -> str:
    """``conf/experiment/exp.yaml`` declaring ``decl``, committed at ``at``; returns the commit."""
    path = repo / "conf" / "experiment" / "exp.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# @package _global_\n# {comment}\nexperiment_name: exp\n"
                    + yaml.safe_dump({"comparison": decl}))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "exp", at=at)
    return git(repo, "rev-parse", "--short=12", "HEAD")


def sweep(root, runs_commit: str):
    """Four completed runs launched with ``experiment=exp`` at ``runs_commit``, the first begun at ``STARTED``."""
    rng = np.random.default_rng(0)
    for i, (arm, seed) in enumerate((a, s) for a in ("fixed", "ema") for s in (0, 1)):
        run = write_run(root / f"{arm}-{seed}", arm, seed, (rng.random(PROMPTS) < 0.5).astype(float), decl=DECL)
        overrides = run / ".hydra" / "overrides.yaml"
        overrides.write_text(yaml.safe_dump(yaml.safe_load(overrides.read_text()) + ["experiment=exp"]))
        status = json.loads((run / "status.json").read_text())
        status |= {"started": STARTED + 60 * i, "provenances": [{"commit": runs_commit}]}
        (run / "status.json").write_text(json.dumps(status))
    return root


def repo_and_runs(tmp_path, *, late: dict | None = None, comment: str = ""):
    """A checkout whose experiment file was committed before the first run began (the runs ran that commit) and,
    with ``late``, committed again with that block an hour after it began."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    ran = commit_experiment(repo, DECL, at=STARTED - 3600)
    if late is not None:
        commit_experiment(repo, late, at=STARTED + 3600, comment=comment)
    return repo, load_sweep(sweep(tmp_path / "sweep", ran))


def test_a_config_committed_before_the_first_run_shows_its_commit_and_no_flag(tmp_path):
    repo, _ = repo_and_runs(tmp_path)
    report = build_report(tmp_path / "sweep", repo=repo)
    head = git(repo, "rev-parse", "HEAD")
    line = dict(report.setup["grpo"])["experiment config"]
    assert line == (f"conf/experiment/exp.yaml, last changed in commit {head[:7]} (2027-01-15T07:00:00Z); "
                    f"runs' commit(s): {head[:12]}; first run began 2027-01-15T08:00:00Z")
    assert f"| experiment config | {line} |" in report.markdown_path.read_text()
    recorded = json.loads(report.summary_path.read_text())["comparison"]["experiment_configs"]
    assert recorded[0]["commit"] == head and recorded[0]["changed_after_first_run_began"] is False
    assert recorded[0]["comparison_block_changes"] == []


def test_a_config_committed_after_the_first_run_began_is_flagged_with_the_comparison_block_unchanged(tmp_path):
    _, runs = repo_and_runs(tmp_path, late=DECL, comment="a comment edited after the sweep began")
    [h] = histories(runs, tmp_path / "repo")
    assert h.changed_after_start and h.block_changes == []
    line = h.line()
    assert "CHANGED AFTER THE FIRST RUN BEGAN (committed after it); the comparison block is unchanged" in line
    assert f"do not contain commit {h.commit[:7]}: the runs did not have this version of the file" in line


def test_an_edit_after_the_runs_then_reverted_is_the_runs_version_with_the_commits_named(tmp_path):
    """A file edited after the first run began and then restored byte for byte is the version the runs had: its
    last change is the runs' commit's, not flagged, and the edit and revert are named."""
    repo, runs = repo_and_runs(tmp_path, late=DECL, comment="a comment edited after the sweep began")
    ran = git(repo, "rev-list", "--max-parents=0", "HEAD")
    edit = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", ran, "--", "conf/experiment/exp.yaml")
    git(repo, "commit", "-q", "-m", "revert", at=STARTED + 7200)
    [h] = histories(runs, repo)
    assert h.commit == ran and not h.changed_after_start and not h.not_in_runs
    assert h.restored_in == [git(repo, "rev-parse", "HEAD"), edit]
    assert h.line().endswith(f"edited after the runs and restored to their version (commit(s) "
                             f"{h.restored_in[0][:7]}, {edit[:7]})")


def test_an_edit_of_the_comparison_block_after_the_first_run_began_names_the_field(tmp_path):
    _, runs = repo_and_runs(tmp_path, late=block(["fixed", "ema"], seeds=(0, 1, 2)))
    [h] = histories(runs, tmp_path / "repo")
    assert "the comparison block differs: fields seeds" in h.line()
    assert h.to_dict()["comparison_block_changes"] == ["seeds"]


def test_an_uncommitted_edit_is_flagged(tmp_path):
    repo, runs = repo_and_runs(tmp_path)
    path = repo / "conf" / "experiment" / "exp.yaml"
    path.write_text(path.read_text() + "  equivalence_margin: 0.2\n")  # the last key of the file is comparison
    [h] = histories(runs, repo)
    assert "CHANGED AFTER THE FIRST RUN BEGAN (edited since its last commit); the comparison block differs: fields " \
           "equivalence_margin" in h.line()


def test_without_git_the_line_says_the_commit_is_unknown(tmp_path):
    repo, runs = repo_and_runs(tmp_path)
    (repo / ".git").rename(tmp_path / "moved.git")
    [h] = histories(runs, repo)
    assert h.line().startswith("conf/experiment/exp.yaml, commit unknown (not a git checkout); runs' commit(s): ")
    report = build_report(tmp_path / "sweep", repo=repo)
    assert "commit unknown (not a git checkout)" in dict(report.setup["grpo"])["experiment config"]


def test_hydra_s_recorded_choice_names_the_experiment_before_experiment_name(tmp_path):
    _, runs = repo_and_runs(tmp_path)
    run = runs[0]
    (run.path / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(
        {"hydra": {"runtime": {"choices": {"experiment": "chosen"}}}}))
    run.config["experiment_name"] = "renamed"
    assert experiment_of(run) == "chosen"
    (run.path / ".hydra" / "hydra.yaml").unlink()
    assert experiment_of(run) == "exp"  # the overrides' experiment=exp


def test_a_deleted_file_or_no_git_program_is_one_phrase(tmp_path, monkeypatch):
    repo, runs = repo_and_runs(tmp_path)
    git(repo, "rm", "-q", "conf/experiment/exp.yaml")
    git(repo, "commit", "-q", "-m", "gone", at=STARTED + 3600)
    [h] = histories(runs, repo)
    assert f"commit unknown (deleted from this checkout after commit {git(repo, 'rev-parse', 'HEAD')[:7]})" in h.line()
    monkeypatch.setenv("PATH", str(tmp_path))  # no git on the path
    [h] = histories(runs, repo)
    assert h.line().startswith("conf/experiment/exp.yaml, commit unknown (git not found); ")


def test_the_report_s_comparison_defaults_are_the_config_s():
    assert BLOCK_DEFAULTS == flat_fields(dataclasses.asdict(ComparisonConfig()))
