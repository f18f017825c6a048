"""How a run presents itself to W&B, so the default workspace draws one line per compared setting.

W&B groups runs by ``group`` and draws one mean line (with a band) per group. So:
- ``group`` = ``<experiment>/<sweep>/<setting>`` where the setting is the strategy (DPO: strategy and
  loss) plus every override the sweep varies across its jobs but the seed (``refexp/record/overrides.py``, the
  report's grouping; an override every job shares is no setting): the seeds of one setting average into
  one line, and settings never collapse into one;
- ``job_type`` = the strategy; for DPO ``<strategy>:<loss_type>`` (TR-DPO ``periodic_reset:sigmoid``,
  SimPO ``none:simpo`` and ORPO ``none:orpo`` stay apart); for GRPO's continued-SFT baseline its
  ``algo.objective``, ``continued_sft`` (the config's and the report's word for it);
- tags ``algo:``, ``task:``, ``ref:``, ``loss:`` (DPO), ``sweep:<sweep>``; the config gets ``sweep_id``;
- ``name`` = the swept overrides, seed included (one run).
Outside a sweep, or when the sweep's command line is not on disk (a sweeper that writes no
``multirun.yaml``, such as Optuna's), every override counts as swept.
``logger.group`` replaces the derived group.
"""

from __future__ import annotations

from pathlib import Path
from typing import Collection, Optional

from refexp.record.metric_names import summaries
from refexp.record.overrides import only_swept, swept_keys, swept_settings

SUMMARIES = summaries()
"""The runs table's summary of a metric: the best held-out accuracy, the last drift (W&B's default is
the last value of everything); stated in the metric registry (``refexp/record/metric_names.py``)."""


def job_type(algo: str, strategy: str, loss_type: Optional[str], objective: str = "grpo") -> str:
    """The strategy; DPO's ``strategy:loss``; GRPO's ``algo.objective`` when it is not ``grpo``
    (``continued_sft``: the continued-SFT baseline). ``loss_type`` is DPO's (None for other algorithms)."""
    if algo == "grpo" and objective != "grpo":
        return objective
    return f"{strategy}:{loss_type}" if algo == "dpo" and loss_type else strategy


def setting_label(algo: str, strategy: str, loss_type: Optional[str], overrides: list[str],
                  objective: str = "grpo") -> str:
    """The setting a group stands for: ``periodic_reset reference.reset_every=20`` (seed left out)."""
    settings = swept_settings(overrides, drop=("algo", "reference", "experiment"))
    return " ".join([job_type(algo, strategy, loss_type, objective),
                     *(f"{k}={v}" for k, v in sorted(settings.items()))])


def run_info(*, experiment: str, algo: str, strategy: str, task: str, loss_type: Optional[str],
             overrides: list[str], sweep: Optional[str], group: Optional[str] = None,
             swept: Optional[Collection[str]] = None, objective: str = "grpo") -> dict:
    """W&B ``group`` / ``job_type`` / ``name`` / ``tags`` / ``sweep_id`` of one run (see the module docstring).
    ``loss_type``: DPO's (None for other algorithms); ``objective``: GRPO's ``algo.objective``.
    ``swept``: the keys the sweep varies (``overrides.swept_keys``); None counts every override."""
    if swept is not None:
        overrides = only_swept(overrides, swept)
    setting = setting_label(algo, strategy, loss_type, overrides, objective)
    derived = "/".join(p for p in (experiment, sweep, setting) if p)
    tags = [f"algo:{algo}", f"task:{task}", f"ref:{strategy}"]
    if algo == "dpo" and loss_type:
        tags.append(f"loss:{loss_type}")
    if sweep:
        tags.append(f"sweep:{sweep}")
    name = ",".join(o for o in overrides if not o.startswith(("hydra", "experiment"))) or strategy
    return {"group": group or derived, "job_type": job_type(algo, strategy, loss_type, objective), "name": name,
            "tags": tags, "sweep_id": sweep}


def hydra_run_info(cfg) -> dict:
    """``run_info`` of a validated RootConfig, with the overrides and sweep dir from Hydra's runtime
    (none outside Hydra: a run started from Python)."""
    overrides: list[str] = []
    sweep = swept = None
    try:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
        overrides = list(hc.overrides.task)
        if hc.mode.name == "MULTIRUN":
            sweep = Path(hc.sweep.dir).name
            sweep_command = saved_sweep_overrides(hc.sweep.dir)
            swept = swept_keys(sweep_command) if sweep_command is not None else None
    except ValueError:  # HydraConfig was not set: not started by Hydra
        pass
    return run_info(experiment=cfg.experiment_name, algo=cfg.algo.name, strategy=cfg.reference.name,
                    task=cfg.task.name, loss_type=getattr(cfg.algo, "loss_type", None), overrides=overrides,
                    sweep=sweep, group=cfg.logger.group, swept=swept,
                    objective=getattr(cfg.algo, "objective", "grpo"))


def saved_sweep_overrides(sweep_dir) -> Optional[list[str]]:
    """The sweep's ``hydra.sweeper.params`` and command line as ``key=value`` overrides, from the
    ``multirun.yaml`` Hydra's basic sweeper writes in the sweep dir before its first job; None without one."""
    from omegaconf import OmegaConf

    saved = Path(sweep_dir) / "multirun.yaml"
    if not saved.is_file():
        return None
    hydra_node = OmegaConf.to_container(OmegaConf.load(saved).hydra, resolve=False)
    params = hydra_node["sweeper"].get("params") or {}
    return [*(f"{k}={v}" for k, v in params.items()), *hydra_node["overrides"]["task"]]
