"""Optional: the report's numbers as a ``wandb.Table``. wandb is imported lazily and any error is
reported and swallowed: W&B misbehaving must never cost the researcher the report on disk."""

from __future__ import annotations

import sys


def _rows(report) -> tuple[list[str], list[list]]:
    """One row per group, numbers (not "a ± b" strings) so W&B can sort and plot them."""
    keys = sorted({c.key for t in report.tables.values() for c in t.columns})
    columns = ["algo", "group", "strategy", "n"] + [f"{k}{s}" for k in keys for s in ("", "_ci95")]
    columns += ["steps_to_target", "target"]
    data = []
    for algo, table in report.tables.items():
        for row in table.rows:
            cells: list = [algo, row.group.label, row.group.strategy, row.n_completed]
            for k in keys:
                est = row.cells.get(k)
                cells += [est.mean if est else None, est.half_width if est else None]
            t = row.to_target
            cells += [t.estimate.mean if t and t.estimate else None, table.target]
            data.append(cells)
    return columns, data


def _experiment(report) -> str:
    return next((str(r.config["experiment_name"]) for r in report.runs if r.config.get("experiment_name")),
                "refexp")


def log_to_wandb(report, *, start_run: bool = False) -> bool:
    """Log the table and the plots to the active W&B run, or to a new ``job_type="report"`` run when
    ``start_run``: in the training runs' project and entity, group ``<experiment>/<sweep>/report``, tagged
    ``sweep:<sweep>`` (so the sweep's workspace shows it), its files in the sweep dir. Returns whether
    anything was logged."""
    try:
        import wandb
    except Exception:
        print("refexp-report: wandb is not importable; nothing logged to W&B", file=sys.stderr)
        return False
    try:
        from refexp.report.writing.wandb_workspace import _project_and_entity

        run, started = wandb.run, False
        if run is None:
            if not start_run:
                return False
            project, entity = _project_and_entity(report)
            sweep = report.sweep_dir.name
            run = wandb.init(project=project, entity=entity, job_type="report",
                             group=f"{_experiment(report)}/{sweep}/report",
                             name=f"report-{sweep}", tags=[f"sweep:{sweep}"], dir=str(report.sweep_dir),
                             settings=wandb.Settings(silent=True, console="off"))
            started = True
        columns, data = _rows(report)
        logged = {"report/table": wandb.Table(columns=columns, data=data)}
        for algo, plots in report.plots.items():
            for kind, path in plots.items():
                logged[f"report/{algo}_{kind}"] = wandb.Image(str(path))
        run.log(logged)
        if started:
            run.finish()
        return True
    except Exception as e:  # wandb raises many kinds; the report is already written
        print(f"refexp-report: logging to W&B failed ({e.__class__.__name__}: {e}); report kept",
              file=sys.stderr)
        return False
