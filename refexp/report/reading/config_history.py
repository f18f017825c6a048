"""Whether a pre-registered sweep ran the experiment file it declares: the experiment file's last commit in the
refexp checkout the report code lives in, against when the sweep's first run began and which commit the runs ran.

A sweep launched with ``refexp experiment=NAME -m`` declares its comparison in ``conf/experiment/NAME.yaml``. A file
committed after the first run began (or edited and not committed) may not be what the runs were launched with; the
report flags it and says whether the ``comparison:`` block itself moved (the runs' ``resolved_config.yaml`` against
the file now), so an edit of comments alone reads as such. Everything is read at report time; where git or the file
is missing the line says so in one phrase and the report goes on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Optional

import yaml

from refexp.record import layout
from refexp.record.provenance import git
from refexp.record.status import first_started, provenances
from refexp.report.reading.load import Run, _get

REPO = Path(__file__).resolve().parents[3]
"""The checkout beside the package (``refexp/__main__.py``'s ``CONF_DIR`` is its ``conf/``: the experiment files
Hydra composed the runs from)."""

DEFAULT_NAME = "default"
"""``experiment_name`` when no experiment was chosen (``refexp/config/root.py``)."""
BLOCK_DEFAULTS = {"arm_key": "", "arms": [], "baseline": "", "seeds": [], "metric": "eval/accuracy", "primary": [],
                  "metrics": [], "equivalence_margin": None, "at_steps": [], "chosen_on_test": [], "frontier_key": "",
                  "frontier_gap": None, "matched.axis": "kl/init", "matched.at": [], "matched.along": "axis",
                  "matched.max_gap": None, "matched.estimand": "frontier", "matched.grids": {},
                  "select.metric": "",
                  "select.maximize": True, "select.floor": {}, "select.floor_change": {}, "select.budget": None}
"""``ComparisonConfig``'s defaults by dotted field (``refexp/config/comparison.py``, a layer above the report, so
mirrored here; tests/test_report_config_history.py checks they agree): what a field an experiment file leaves out
resolves to."""
SWEEP_DEPTH = 3
"""How far above a run dir its sweep's ``multirun.yaml`` is looked for (``0`` and ``3/1`` are one and two below)."""


def _yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None


def _choice(hydra_yaml: Any) -> tuple[bool, Optional[str]]:
    """(whether Hydra recorded its config choices, the ``experiment`` choice) from a hydra.yaml / multirun.yaml."""
    choices = _get(hydra_yaml, "hydra.runtime.choices") if isinstance(hydra_yaml, dict) else None
    if not isinstance(choices, dict):
        return False, None
    name = choices.get("experiment")
    return True, (str(name) if name else None)


def experiment_of(run: Run) -> Optional[str]:
    """The experiment file a run was launched with (``experiment=NAME``; None: none): Hydra's record of the choice
    (the run's ``.hydra/hydra.yaml``, its overrides, its sweep's ``multirun.yaml``), else ``experiment_name``."""
    recorded, name = _choice(_yaml(run.path / layout.HYDRA_DIR / "hydra.yaml"))
    if recorded:
        return name
    if name := run.override("experiment"):
        return name
    for sweep in list(run.path.parents)[:SWEEP_DEPTH]:
        if (sweep / "multirun.yaml").is_file():
            recorded, name = _choice(_yaml(sweep / "multirun.yaml"))
            if recorded:
                return name
            break
    name = _get(run.config, "experiment_name")
    return str(name) if name and name != DEFAULT_NAME else None


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def flat_fields(block: Any) -> dict[str, Any]:
    """``{"arms": [...], "select.metric": ..., "select.floor": {...}}``: a comparison block's fields by dotted name
    (a sub-block's, ``select``'s, one level down; a mapping inside it, ``floor``, is one field)."""
    out = {}
    for k, v in (block if isinstance(block, dict) else {}).items():
        if isinstance(v, dict):
            out |= {f"{k}.{sub}": w for sub, w in v.items()}
        else:
            out[str(k)] = v
    return out


def block_difference(ran: dict, now: Any) -> list[str]:
    """The fields of the comparison block whose value differs between the runs' resolved block (``ran``) and the
    file's (``now``; a field the file leaves out counts as its default, ``BLOCK_DEFAULTS``)."""
    file_block = BLOCK_DEFAULTS | flat_fields(now)
    ran_block = BLOCK_DEFAULTS | flat_fields(ran)
    return sorted(k for k in file_block.keys() | ran_block.keys() if file_block.get(k) != ran_block.get(k))


@dataclass
class ConfigHistory:
    """One experiment file against the runs launched with it."""

    name: str
    path: str
    """``conf/experiment/NAME.yaml``, relative to the checkout."""
    runs_commits: list[str]
    first_started: Optional[float]
    """The earliest first invocation's start among the runs (unix seconds; ``status.first_started``)."""
    unknown: Optional[str] = None
    """Why the file's commit is unknown (not a git checkout, git not found, never committed, file gone), else None."""
    commit: Optional[str] = None
    committed: Optional[float] = None
    uncommitted: bool = False
    """The working tree's file differs from its last commit."""
    block_changes: Optional[list[str]] = None
    """The comparison block's fields that differ, runs vs the file now ([]: unchanged; None: not compared)."""
    not_in_runs: list[str] = field(default_factory=list)
    """Runs' commits that do not contain ``commit`` (``git merge-base --is-ancestor`` false)."""
    runs_commits_unknown: list[str] = field(default_factory=list)
    """Runs' commits this checkout does not hold, so whether they contain ``commit`` is unknown."""
    restored_in: list[str] = field(default_factory=list)
    """Commits after the runs' that touched the file although its content now is the runs' own (an edit and its
    revert): ``commit`` is then the file's last change as the runs' commit holds it."""

    @property
    def committed_late(self) -> bool:
        """Its last commit is later than the first run's start."""
        return self.committed is not None and self.first_started is not None and self.committed > self.first_started

    @property
    def changed_after_start(self) -> bool:
        """Committed after the first run began, or edited since its last commit."""
        return self.committed_late or self.uncommitted

    def line(self) -> str:
        """The setup block's ``experiment config`` value."""
        head = f"{self.path}, " + (f"commit unknown ({self.unknown})" if self.unknown else
                                   f"last changed in commit {self.commit[:7]} ({_iso(self.committed)})")
        parts = [head, f"runs' commit(s): {', '.join(self.runs_commits) or 'not recorded'}"]
        if self.first_started is not None:
            parts.append(f"first run began {_iso(self.first_started)}")
        if self.changed_after_start:
            why = [w for w, on in (("committed after it", self.committed_late),
                                   ("edited since its last commit", self.uncommitted)) if on]
            parts.append(f"CHANGED AFTER THE FIRST RUN BEGAN ({' and '.join(why)})")
        if self.block_changes is not None and (self.changed_after_start or self.block_changes):
            parts.append("the comparison block is unchanged" if not self.block_changes else
                         f"the comparison block differs: fields {', '.join(self.block_changes)}")
        if self.restored_in:
            parts.append(f"edited after the runs and restored to their version (commit(s) "
                         f"{', '.join(c[:7] for c in self.restored_in)})")
        if self.not_in_runs:
            parts.append(f"the runs' commit(s) {', '.join(self.not_in_runs)} do not contain commit {self.commit[:7]}: "
                         f"the runs did not have this version of the file")
        if self.runs_commits_unknown:
            parts.append(f"commit(s) {', '.join(self.runs_commits_unknown)} not in this checkout")
        return "; ".join(parts)

    def to_dict(self) -> dict:
        return {"experiment": self.name, "path": self.path, "commit": self.commit,
                "committed": _iso(self.committed) if self.committed is not None else None,
                "commit_unknown": self.unknown, "runs_commits": self.runs_commits,
                "first_run_began": _iso(self.first_started) if self.first_started is not None else None,
                "changed_after_first_run_began": self.changed_after_start, "uncommitted_edit": self.uncommitted,
                "comparison_block_changes": self.block_changes, "runs_commits_without_it": self.not_in_runs,
                "runs_commits_not_in_checkout": self.runs_commits_unknown,
                "restored_in": self.restored_in}


def _runs_facts(runs: list[Run]) -> tuple[list[str], Optional[float], Optional[dict]]:
    """(the distinct refexp commits in the runs' status.json, the earliest first invocation's start, the first recorded
    comparison block)."""
    commits = list(dict.fromkeys(str(p["commit"]) for r in runs if r.status for p in provenances(r.status)
                                 if p.get("commit")))
    starts = [t for r in runs if r.status and (t := first_started(r.status)) is not None]
    blocks = [b for r in runs if isinstance(b := _get(r.config, "comparison"), dict)]
    return commits, (min(starts) if starts else None), (blocks[0] if blocks else None)


def history(name: str, runs: list[Run], repo: Optional[Path] = None) -> ConfigHistory:
    """``conf/experiment/NAME.yaml`` in ``repo`` (None: ``REPO``) against ``runs`` launched with it."""
    repo = Path(repo or REPO)
    rel = f"conf/experiment/{name}.yaml"
    commits, first, ran_block = _runs_facts(runs)
    out = ConfigHistory(name, rel, commits, first)
    top = git(repo, "rev-parse", "--show-toplevel")
    if top is None:
        out.unknown = "git not found"
        return out
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != repo.resolve():
        out.unknown = "not a git checkout"
        return out
    log = git(repo, "log", "-1", "--format=%H%x09%ct", "--", rel)
    fields = log.stdout.split() if log is not None and log.returncode == 0 else []
    on_disk = (repo / rel).is_file()
    if len(fields) != 2:
        out.unknown = "never committed" if on_disk else "no such file in this checkout"
        return out
    if not on_disk:
        out.unknown = f"deleted from this checkout after commit {fields[0][:7]}"
        return out
    out.commit, out.committed = fields[0], float(fields[1])
    _as_the_runs_had_it(out, repo, rel, commits)
    status = git(repo, "status", "--porcelain", "--", rel)
    out.uncommitted = bool(status is not None and status.stdout.strip())
    if ran_block is not None:
        doc = _yaml(repo / rel)
        out.block_changes = block_difference(ran_block, doc.get("comparison") if isinstance(doc, dict) else None)
    for c in commits:
        # "-dirty": the run's tree had edits beyond that commit (refexp/record/provenance.py); its base still holds
        # or lacks the file's commit
        ancestor = git(repo, "merge-base", "--is-ancestor", out.commit, c.removesuffix("-dirty"))
        if ancestor is not None and ancestor.returncode == 1:
            out.not_in_runs.append(c)
        elif ancestor is None or ancestor.returncode != 0:
            out.runs_commits_unknown.append(c)
    return out


def _as_the_runs_had_it(out: ConfigHistory, repo: Path, rel: str, commits: list[str]) -> None:
    """Where the file's committed content is exactly what every runs' commit holds, although commits after them
    touched it (an edit, then its revert), its last change is the one those runs' commit holds: a file's version is
    its content, not the last commit that named it."""
    bases = [c.removesuffix("-dirty") for c in commits]
    head = git(repo, "rev-parse", f"HEAD:{rel}")
    if not bases or head is None or head.returncode != 0:
        return
    for base in bases:
        blob = git(repo, "rev-parse", f"{base}:{rel}")
        if blob is None or blob.returncode != 0 or blob.stdout.strip() != head.stdout.strip():
            return
    held = git(repo, "log", "-1", "--format=%H%x09%ct", bases[0], "--", rel)
    fields = held.stdout.split() if held is not None and held.returncode == 0 else []
    if len(fields) != 2 or fields[0] == out.commit:
        return
    later = git(repo, "log", "--format=%H", f"{fields[0]}..HEAD", "--", rel)
    out.restored_in = later.stdout.split() if later is not None and later.returncode == 0 else []
    out.commit, out.committed = fields[0], float(fields[1])


def histories(runs: Iterable[Run], repo: Optional[Path] = None) -> list[ConfigHistory]:
    """One ``ConfigHistory`` per experiment file the runs were launched with (none for runs without one)."""
    by_name: dict[str, list[Run]] = {}
    for r in runs:
        if (name := experiment_of(r)) is not None:
            by_name.setdefault(name, []).append(r)
    return [history(name, rs, repo) for name, rs in by_name.items()]
