"""``refexp-report SWEEP --wandb-workspace``: a saved W&B workspace that compares a sweep's strategies.

Built with ``wandb-workspaces`` (W&B's own library for saved views): the sweep's runs only (tag
``sweep:<dir>``, ``refexp/components/wandb_conventions.py``), grouped by W&B ``group`` — one line per compared
setting, its seeds averaged with a min-max band — and four sections:
- accuracy and drift: ``eval/accuracy`` (or ``eval/pref_accuracy``) and ``kl/init`` against ``step``, and
  each run's best accuracy against its last drift (the runs table's summaries);
- reference events: ``ref/version`` (a step up is a reset / sync) and ``kl/ref``;
- rewards: GRPO's ``reward/mean``, DPO's ``rewards/margins`` and ``rewards/accuracies``;
- cost: ``perf/step_s``, ``perf/ref_fwd_s``, ``perf/gen_s``, ``mem/peak_rss_mb``, ``mem/peak_gpu_mb``.
Saving needs a W&B server and an API key; without them the view's spec (the JSON W&B stores for a saved
view) is written to ``<sweep>/wandb_workspace.json`` to publish later with ``--wandb-workspace`` online.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from refexp.record.metric_names import (
    EVAL_ACCURACY,
    EVAL_PREF_ACCURACY,
    KL_INIT,
    KL_REF,
    MEM_PEAK_GPU_MB,
    MEM_PEAK_RSS_MB,
    PERF_GEN_S,
    PERF_REF_FWD_S,
    PERF_STEP_S,
    REF_VERSION,
    REWARD_MEAN,
    REWARDS_ACCURACIES,
    REWARDS_MARGINS,
)

SECTIONS: dict[str, list[str]] = {
    "Accuracy and drift": [EVAL_ACCURACY, EVAL_PREF_ACCURACY, KL_INIT],
    "Reference events": [REF_VERSION, KL_REF],
    "Rewards": [REWARD_MEAN, REWARDS_MARGINS, REWARDS_ACCURACIES],
    "Cost": [PERF_STEP_S, PERF_REF_FWD_S, PERF_GEN_S, MEM_PEAK_RSS_MB, MEM_PEAK_GPU_MB],
}
SPEC_FILE = "wandb_workspace.json"


def _line(metric: str):
    import wandb_workspaces.reports.v2 as wr

    return wr.LinePlot(title=metric, x="step", y=[metric], groupby_aggfunc="mean", groupby_rangefunc="minmax")


def build_workspace(*, entity: str, project: str, sweep_id: str, name: Optional[str] = None,
                    logged: Optional[set[str]] = None):
    """The workspace (a ``wandb_workspaces.workspaces.Workspace``) for one sweep; ``logged`` keeps only
    panels of metrics some run logged (None keeps all)."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    keep = (lambda m: True) if logged is None else (lambda m: m in logged)  # noqa: E731
    sections = []
    for title, metrics in SECTIONS.items():
        panels = [_line(m) for m in metrics if keep(m)]
        if title == "Accuracy and drift":
            acc = next((m for m in (EVAL_ACCURACY, EVAL_PREF_ACCURACY) if keep(m)), None)
            if acc and keep(KL_INIT):
                panels.append(wr.ScatterPlot(title=f"best {acc} vs last kl/init", x=wr.SummaryMetric(KL_INIT),
                                             y=wr.SummaryMetric(acc)))
        if panels:
            sections.append(ws.Section(name=title, panels=panels, is_open=True))
    return ws.Workspace(
        entity=entity, project=project, name=name or f"refexp {sweep_id}", sections=sections,
        settings=ws.WorkspaceSettings(x_axis="step"),
        runset_settings=ws.RunsetSettings(filters=ws.And(ws.Tags().isin([f"sweep:{sweep_id}"])),
                                          groupby=[ws.Metric("Group")]),
    )


def workspace_spec(workspace) -> dict:
    """The JSON W&B stores for the saved view (what ``Workspace.save`` uploads)."""
    return json.loads(workspace._to_model().model_dump_json(by_alias=True, exclude_none=True))


def _project_and_entity(report) -> tuple[str, Optional[str]]:
    """The training runs' W&B project and entity, from their resolved config."""
    for r in report.runs:
        logger = r.config.get("logger")
        if isinstance(logger, dict):
            return logger.get("project") or "refexp", logger.get("entity")
    return "refexp", None


def save_workspace(report, *, online: Optional[bool] = None) -> str:
    """Save the sweep's workspace to W&B (returns its URL), or, offline, write its spec next to the
    report (returns the file's path). ``online`` None: online when ``WANDB_API_KEY`` is set and
    ``WANDB_MODE`` is not offline/disabled."""
    project, entity = _project_and_entity(report)
    if online is None:
        online = bool(os.environ.get("WANDB_API_KEY")) and os.environ.get("WANDB_MODE") not in ("offline", "disabled")
    if online and entity is None:
        import wandb

        entity = wandb.Api().default_entity
    logged = {k for r in report.runs for k in r.metric_names()}
    workspace = build_workspace(entity=entity or "<entity>", project=project, sweep_id=report.sweep_dir.name,
                                logged=logged)
    if online:
        return workspace.save().url
    from refexp.record.atomic import write_text_atomic

    path = Path(report.sweep_dir) / SPEC_FILE
    write_text_atomic(path, json.dumps(workspace_spec(workspace), indent=1) + "\n")
    return str(path)
