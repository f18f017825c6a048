"""refexp.report: a sweep directory in, a comparison a researcher can trust out.

    from refexp.report import build_report, format_table
    report = build_report("multirun/my_sweep/2025-01-01_00-00-00", baseline="fixed")
    print(format_table(report))

or ``refexp-report SWEEP_DIR [--baseline fixed] [--alpha 0.05] [--equivalence-margin M] [--allow-mixed] [--quiet]``.

This package reads files only and imports from refexp only two foundations, ``refexp.record`` (the run
record's readers, the metric names, atomic writes) and ``refexp.record.overrides`` (the swept settings W&B groups
by too). The files it reads, per run dir
(found at any depth below SWEEP_DIR by having ``.hydra/``, ``metrics.jsonl`` or ``status.json``):

- ``status.json``: {"status": running|completed|failed, "error", "algo", "reference", "seed",
  "steps", "last_step", "final": {metric: value}}. Only ``completed`` runs are counted; every other
  run (and a run without the file) is listed with its error.
- ``metrics.jsonl``: one JSON object per logged step with ``"step"``; names in ``refexp/record/metric_names.py``.
- ``.hydra/overrides.yaml``: the swept ``key=value``s; minus the seed and ``hydra*`` they define the
  group. ``resolved_config.yaml`` (else ``.hydra/config.yaml``) supplies algo.name, reference.name
  and training.seed when status.json lacks them.

Three rooms, in the order a report is made (``build`` runs them):

- ``reading/``: load (read runs) → group (seeds together, variant names) → reduce (one number per run) →
  plan (the declared comparison, the runs it leaves out) → setup (what the runs were).
- ``statistics/``: stats (mean, t-interval over seeds or SFT starts, seed bands), paired (bootstrap differences
  against the baseline over seeds and the prompts they share, ``bootstrap``; the verdict Holm's step-down
  decides, beside simultaneous intervals, ``inference``), summary (a table's numbers and
  verdicts), own_change, metric_scores; with ``frontier_key`` or ``select``, frontier (accuracy against drift
  across that key, arms at matched drift) and selection (each arm at its setting chosen on validation,
  compared on test).
- ``writing/``: cells and table (the strings every output prints), plots, render (report.md, report.html,
  summary.json), frontier_plots and frontier_report (the frontier and selection sections), wandb_table and
  wandb_workspace.
"""

from refexp.report.build import Report, build_report
from refexp.report.statistics.stats import t_quantile
from refexp.report.writing.table import format_table

__all__ = ["Report", "build_report", "format_table", "t_quantile"]
