"""refexp.report: a sweep directory in, a comparison a researcher can trust out.

    from refexp.report import build_report, format_table
    report = build_report("multirun/my_sweep/2025-01-01_00-00-00", baseline="fixed")
    print(format_table(report))

or ``refexp-report SWEEP_DIR [--baseline fixed] [--alpha 0.05] [--equivalence-margin M] [--allow-mixed] [--quiet]``.

This package reads files only and imports from refexp only the two layers below it (docs/architecture.md):
``refexp.record`` (the run record's readers, the metric names, the swept settings W&B groups by too, provenance,
atomic writes) and ``refexp.choices`` (the reference strategies' names, and the config values renamed since runs
recorded them). The files it reads, per run dir
(found at any depth below SWEEP_DIR by having ``.hydra/``, ``metrics.jsonl`` or ``status.json``):

- ``status.json``: {"status": running|completed|failed, "error", "algo", "reference", "seed",
  "steps", "last_step", "final": {metric: value}}. Only ``completed`` runs are counted; every other
  run (and a run without the file) is listed with its error.
- ``metrics.jsonl``: one JSON object per logged step with ``"step"``; names in ``refexp/record/metric_names.py``.
- ``.hydra/overrides.yaml``: the swept ``key=value``s; minus the seed and ``hydra*`` they define the
  group. ``resolved_config.yaml`` (else ``.hydra/config.yaml``) supplies algo.name, reference.name
  and training.seed when status.json lacks them.

Rooms, in the order a report is made (``build`` runs them), each importing only the ones before it:

- ``reading/``: load (read runs) → group (seeds together, variant names) → reduce (one number per run) →
  comparison_plan (the declared comparison, the runs it leaves out) → setup (what the runs were).
- ``statistics/``: stats (mean, t-interval over seeds or SFT starts, seed bands), paired (bootstrap differences
  against the baseline over seeds and the prompts they share, ``bootstrap``; the verdict Holm's step-down
  decides, beside simultaneous intervals, ``inference``), summary (a table's numbers and
  verdicts), own_change, gold_peak, gao, metric_scores; with ``frontier_key`` or ``select``, frontier (accuracy
  against drift across that key, arms at matched drift), selection (each arm at its setting chosen on validation,
  compared on test) and oracle.
- ``writing/``: blocks (what a section says: headings, paragraphs, tables, images), render (blocks into report.md
  and report.html, entries into summary.json), cells and table (the strings every output prints), plots and
  frontier_plots, wandb_table and wandb_workspace, runs_not_stored (the notice on a committed report whose runs are
  gone).
- ``sections/``: one module per analysis (first screen, comparison table, own change, gold peak, within start,
  frontier, Gao, samples, ...), each computing its result and saying it as blocks and summary.json entries;
  ``sections/__init__.py`` lists them once.
- ``power/``: the power plan (``refexp-report --plan EXPERIMENT --pilot PILOT``): experiment (the declared design),
  pilot (variance components from a pilot), detectable (the detectable difference), plan (its text).

``version.REPORT_VERSION`` is bumped whenever a report's output changes; summary.json records it.

Besides the report, the readers an exploratory analysis of a sweep builds on (``scripts/analysis/``):
``runs_source`` and ``load_sweep`` (a sweep's runs, from its dir or its ``runs.tar.xz``), ``make_plan`` (its
comparison), ``last`` (a run's final value of a metric), and the frontier's ``curves``, ``declared_matched``,
``key_crossing`` and ``DRIFT_AXIS``.
"""

from refexp.report.build import Report, build_report
from refexp.report.reading.archive import runs_source
from refexp.report.reading.comparison_plan import make_plan
from refexp.report.reading.load import load_sweep
from refexp.report.reading.reduce import last
from refexp.report.statistics.declared_matched import declared_matched
from refexp.report.statistics.frontier import curves
from refexp.report.statistics.frontier_key import key_crossing
from refexp.report.statistics.frontier_points import DRIFT_AXIS
from refexp.report.statistics.stats import t_quantile
from refexp.report.writing.table import format_table

__all__ = ["DRIFT_AXIS", "Report", "build_report", "curves", "declared_matched", "format_table", "key_crossing", "last",
           "load_sweep", "make_plan", "runs_source", "t_quantile"]
