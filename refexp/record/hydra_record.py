"""``.hydra/``: Hydra's record of a job (``config.yaml``, ``hydra.yaml``, ``overrides.yaml``), which the report
reads a run's arm from (``refexp/report/reading/load.py``).

Hydra writes it into the job's output dir before it calls the app, so two launches into one run dir a moment
apart (two default-dir launches in the same second) would both write it, and the one refused by the run dir's lock
(``refexp/run.py``) could leave its overrides in the winner's run dir. conf/config.yaml sets
``hydra.output_subdir: null`` instead, and refexp writes the same three files (``HydraRecord.write``) once the job
holds the run dir's lock and the rerun checks that read the run dir have passed; a job that fails before that (a
config error in a sweep) writes them only where there are none, for the report to list it under its arm.

A rerun of a completed run writes them beside its copy of the record (``refexp/record/rerun.py``), not over the run's:
its command may spell an override another way than the sweep job did (``training.lr=1e-3`` for ``0.001``), and a
rerun that measures nothing changes nothing. They replace the run's once the rerun passes the run's end.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from refexp.record import layout
from refexp.record.atomic import write_text_atomic
from refexp.record.rerun import completed_end, pending_hydra_dir
from refexp.record.status import read_status


class HydraRecord:
    """The ``.hydra/`` files of the running Hydra job, made from ``cfg`` (the app's config, as Hydra passed it)
    and ``HydraConfig``; nothing is written until ``write``."""

    def __init__(self, cfg: DictConfig) -> None:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
        self.dir = layout.path(hc.runtime.output_dir, layout.HYDRA_DIR)
        self.run_dir = cfg.get("run_dir") or hc.runtime.output_dir
        self.files = {"config.yaml": OmegaConf.to_yaml(cfg),
                      "hydra.yaml": OmegaConf.to_yaml(OmegaConf.create({"hydra": hc})),
                      "overrides.yaml": OmegaConf.to_yaml(hc.overrides.task)}

    def write(self) -> None:
        """Each file, atomically (the winner of a run dir's lock): into ``.hydra/``, or, where that is the run dir's
        and the run dir holds a completed run, into the rerun's pending copy (``pending_hydra_dir``)."""
        in_run_dir = Path(self.dir).parent.resolve() == Path(self.run_dir).resolve()
        rerun = in_run_dir and completed_end(read_status(self.run_dir) or {}) is not None
        self._write_to(pending_hydra_dir(self.run_dir) if rerun else Path(self.dir))

    def write_if_absent(self) -> None:
        """The files into ``.hydra/`` where no job wrote ``overrides.yaml`` yet (a job that failed before it held
        the lock)."""
        if not (Path(self.dir) / "overrides.yaml").exists():
            self._write_to(Path(self.dir))

    def _write_to(self, where: Path) -> None:
        for name, text in self.files.items():
            write_text_atomic(where / name, text, encoding="utf-8")
