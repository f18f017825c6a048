"""``.hydra/``: Hydra's record of a job (``config.yaml``, ``hydra.yaml``, ``overrides.yaml``), which the report
reads a run's arm from (``refexp/report/reading/load.py``).

Hydra writes it into the job's output dir before it calls the app, so two launches into one run dir a moment
apart (two default-dir launches in the same second) would both write it, and the one refused by the run dir's lock
(``refexp/run.py``) could leave its overrides in the winner's run dir. conf/config.yaml sets
``hydra.output_subdir: null`` instead, and refexp writes the same three files (``HydraRecord.write``) once the job
holds the run dir's lock and the rerun checks that read the run dir have passed; a job that fails before that (a
config error in a sweep) writes them only where there are none, for the report to list it under its arm.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from refexp.record import layout
from refexp.record.atomic import write_text_atomic


class HydraRecord:
    """The ``.hydra/`` files of the running Hydra job, made from ``cfg`` (the app's config, as Hydra passed it)
    and ``HydraConfig``; nothing is written until ``write``."""

    def __init__(self, cfg: DictConfig) -> None:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
        self.dir = layout.path(hc.runtime.output_dir, layout.HYDRA_DIR)
        self.files = {"config.yaml": OmegaConf.to_yaml(cfg),
                      "hydra.yaml": OmegaConf.to_yaml(OmegaConf.create({"hydra": hc})),
                      "overrides.yaml": OmegaConf.to_yaml(hc.overrides.task)}

    def write(self) -> None:
        """Each file, atomically (the winner of a run dir's lock)."""
        for name, text in self.files.items():
            write_text_atomic(Path(self.dir) / name, text, encoding="utf-8")

    def write_if_absent(self) -> None:
        """``write`` where no job wrote ``overrides.yaml`` yet (a job that failed before it held the lock)."""
        if not (Path(self.dir) / "overrides.yaml").exists():
            self.write()
