"""Hydra callbacks of a ``-m`` sweep: the comparison report, and the sweep's exit status.

``ReportCallback`` (registered by the experiment files, ``hydra.callbacks.report``) turns a finished sweep
into the comparison report, also when some jobs failed (their ``status.json`` says so and the report lists
them). ``JobsCallback`` (registered for every sweep in conf/config.yaml) counts the jobs that did not
complete, and the jobs that raised without a status of their own saying so (a rerun refused because its run dir
holds a run of another configuration, a busy run dir: each job notes itself in the sweep dir,
``refexp/record/failed_jobs.py``, also from a launcher's worker process); ``refexp``'s ``main`` then exits 1
(after every job ran and every callback was called: a callback that raised would stop the ones after it).
The verdicts read the experiment's ``comparison`` block; a sweep without one gets an exploratory comparison
against ``fixed``, else its first group (``refexp/report/reading/comparison_plan.py``), and ``refexp-report
--baseline`` names another.
"""

from __future__ import annotations

from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from refexp.record.failed_jobs import FAILED_JOBS, failed_jobs

NOT_COMPLETED: list[str] = []
"""The run dirs of the last sweep in this process that did not complete: their status.json says so, or the job
raised (``failed_jobs``)."""
def not_completed(sweep_dir: str | Path) -> list[str]:
    """The run dirs under ``sweep_dir`` whose ``status.json`` is not ``completed`` (a dry run writes none)."""
    from refexp.record.status import read_status
    from refexp.report.reading.load import find_run_dirs

    out = []
    for d in find_run_dirs(Path(sweep_dir)):
        status = read_status(d)
        if status is not None and status.get("status") != "completed":
            out.append(f"{d} ({status.get('status')})")
    return out


class JobsCallback(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        from refexp.runtime.distributed import is_rank0

        if is_rank0():  # an earlier sweep's notes are not this one's
            (Path(config.hydra.sweep.dir) / FAILED_JOBS).unlink(missing_ok=True)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from refexp.runtime.distributed import is_rank0

        if is_rank0():
            listed = not_completed(config.hydra.sweep.dir)
            seen = {Path(entry.rsplit(" (", 1)[0]).resolve() for entry in listed}
            raised = [f"{d} ({error})" for d, error in failed_jobs(config.hydra.sweep.dir).items()
                      if Path(d).resolve() not in seen]
            NOT_COMPLETED[:] = listed + raised


class ReportCallback(Callback):
    def __init__(self, target: float | None = None, at_steps: list[int] | None = None) -> None:
        self.target, self.at_steps = target, tuple(at_steps or ())

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from refexp.report import build_report, format_table
        from refexp.runtime.distributed import is_rank0

        if not is_rank0():
            return
        sweep_dir = config.hydra.sweep.dir
        comparison = _declared_comparison(config)
        try:
            report = build_report(sweep_dir, target=self.target, at_steps=self.at_steps, comparison=comparison)
        except Exception as e:  # a report problem must not hide the sweep's own results
            print(f"[refexp] could not build the report for {sweep_dir}: {type(e).__name__}: {e}")
            return
        print(format_table(report))
        print(f"[refexp] report: {report.markdown_path} (and report.html beside it)")


def _declared_comparison(config: DictConfig) -> dict | None:
    """The sweep's ``comparison`` block as a plain dict (None when it declares no arms)."""
    from omegaconf import OmegaConf

    block = OmegaConf.to_container(config.comparison, resolve=True) if "comparison" in config else None
    return block if isinstance(block, dict) and block.get("arms") else None
