"""The design an experiment file declares (``conf/experiment/NAME.yaml``), read as plain YAML for the power plan
(``refexp-report --plan NAME``): its comparison block, its seeds, its SFT starts (the ``sft.seed`` values its
sweep runs; one without) and its prompts per evaluation (``eval.num_prompts`` where the file sets it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from refexp.report.reading.comparison_plan import DEFAULT_METRIC, block_problem, matched_of


def conf_dirs() -> tuple[Path, Path]:
    """Where an experiment name is looked up: the working directory's conf/experiment, then the checkout's beside
    the package."""
    return Path.cwd() / "conf" / "experiment", Path(__file__).resolve().parents[3] / "conf" / "experiment"


class ExperimentError(ValueError):
    """The experiment cannot be planned: the message names the file and the field."""


@dataclass
class Experiment:
    name: str
    path: Path
    block: dict
    starts: int
    prompts: Optional[int]
    """``eval.num_prompts`` as the file sets it; None: not set there (the pilot's is used and the plan says so)."""
    doc: dict = field(default_factory=dict)
    """The whole file, as plain YAML (the design step reads its ``training.steps`` and ``eval.every``)."""

    @property
    def seeds(self) -> int:
        return len(self.block["seeds"])

    @property
    def primary(self) -> list[str]:
        return [str(a) for a in self.block.get("primary") or ()]

    @property
    def metrics(self) -> list[str]:
        """The metrics the primary contrasts are tested on: ``comparison.metrics``, else ``[comparison.metric]``
        (the pilot's variance components are read on the first)."""
        return [str(m) for m in self.block.get("metrics") or ()] or [str(self.block.get("metric") or DEFAULT_METRIC)]

    @property
    def matched_at(self) -> tuple[str, tuple[float, ...]]:
        """``plan.matched_of`` the experiment's comparison block."""
        return matched_of(self.block)

    @property
    def family(self) -> int:
        """The primary family's size: each primary arm on each primary metric (at each declared matched value)."""
        return len(self.primary) * len(self.metrics) * max(len(self.matched_at[1]), 1)

    @property
    def margin(self) -> Optional[float]:
        return self.block.get("equivalence_margin")


def _find(name: str) -> Path:
    given = Path(name)
    if given.suffix in (".yaml", ".yml") and given.is_file():
        return given
    for d in conf_dirs():
        if (d / f"{name}.yaml").is_file():
            return d / f"{name}.yaml"
    known = sorted({p.stem for d in conf_dirs() if d.is_dir() for p in d.glob("*.yaml")})
    raise ExperimentError(f"--plan {name}: no conf/experiment/{name}.yaml; expected one of {', '.join(known)} "
                          f"or a path to an experiment file")


def read_experiment(name: str) -> Experiment:
    """The experiment ``name`` (a conf/experiment name or a file), its comparison block checked as the report
    checks a run's (``plan.block_problem``) and its primary contrasts required."""
    path = _find(name)
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ExperimentError(f"{path}: not readable YAML ({e})") from e
    block = doc.get("comparison")
    if not isinstance(block, dict) or not block.get("arms"):
        raise ExperimentError(f"{path}: no comparison block with arms: nothing to plan")
    problem = block_problem(block)
    if problem:
        raise ExperimentError(f"{path}: {problem}")
    if not block.get("primary"):
        raise ExperimentError(f"{path}: comparison.primary is empty: expected the one to three arms whose "
                              f"difference from {block['baseline']} the sweep is for (the plan is about those)")
    params = (((doc.get("hydra") or {}).get("sweeper") or {}).get("params") or {})
    sft = params.get("sft.seed")
    starts = len([s for s in str(sft).split(",") if s.strip()]) if sft is not None else 1
    prompts = (doc.get("eval") or {}).get("num_prompts")
    return Experiment(path.stem, path, block, starts, int(prompts) if isinstance(prompts, int) else None, doc)
