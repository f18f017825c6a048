"""Hydra callback that turns a finished ``-m`` sweep into the comparison report.

Registered by the experiment files (``hydra.callbacks.report``); runs after the last job, also
when some jobs failed (their ``status.json`` says so and the report lists them). The verdicts read the
experiment's ``comparison`` block; a sweep without one gets its tables, and ``refexp-report --baseline``
makes its exploratory comparison.
"""

from __future__ import annotations

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class ReportCallback(Callback):
    def __init__(self, target: float | None = None, at_steps: list[int] | None = None) -> None:
        self.target, self.at_steps = target, tuple(at_steps or ())

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from refexp.distributed import is_rank0
        from refexp.report import build_report, format_table

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
        failed = [p for p in report.problems if getattr(p, "state", "") == "failed"]
        if failed:
            raise SystemExit(f"[refexp] {len(failed)} job(s) of the sweep failed; see the report's list")


def _declared_comparison(config: DictConfig) -> dict | None:
    """The sweep's ``comparison`` block as a plain dict (None when it declares no arms)."""
    from omegaconf import OmegaConf

    block = OmegaConf.to_container(config.comparison, resolve=True) if "comparison" in config else None
    return block if isinstance(block, dict) and block.get("arms") else None
