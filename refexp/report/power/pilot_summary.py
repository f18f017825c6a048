"""The fields of a report's summary.json that a power plan's pilot reads (``pilot.from_summary``), checked before it
reads them: a summary.json edited by hand or written by something else is one error line naming the field and what it
should hold, never a traceback from deep in the plan.

Only what ``from_summary`` reads is checked, on the pilot's metric alone (``key``: the summary's name for it)::

    algos.ALGO.baseline                                       a group label or null
    algos.ALGO.groups[i].label                                a group label
    algos.ALGO.groups[i].metrics.KEY.{mean, eval_prompts}     a number or null, an integer or null
    algos.ALGO.groups[i].paired_vs_baseline.KEY               a comparison or null
    algos.ALGO.within_sft_start.START.paired_vs_baseline.LABEL.KEY   a comparison or null
    a comparison's sft_starts, seed_only_t95.values           a list of labels, a list of numbers or nulls
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _optional_dict(x: Any) -> bool:
    return x is None or isinstance(x, dict)


def check_summary(summary: Any, key: str, refuse: Callable[[str], Exception]) -> None:
    """Raises ``refuse(message)`` at the first field of ``summary`` (parsed JSON) that ``from_summary`` cannot read
    on the metric ``key``; the message names the field (``algos.grpo.groups[2].label``) and what would be valid."""

    def need(ok: bool, where: str, what: str) -> None:
        if not ok:
            raise refuse(f"{where} is invalid in a report's summary.json: expected {what}")

    def comparison(c: Any, where: str) -> None:
        need(_optional_dict(c), where, "a comparison (an object) or null")
        if not c:
            return
        starts = c.get("sft_starts")
        need(starts is None or (isinstance(starts, list) and all(isinstance(s, str) for s in starts)),
             f"{where}.sft_starts", "a list of SFT start labels or null")
        t95 = c.get("seed_only_t95")
        need(_optional_dict(t95), f"{where}.seed_only_t95", "an object or null")
        values = (t95 or {}).get("values")
        need(values is None or (isinstance(values, list) and all(v is None or _number(v) for v in values)),
             f"{where}.seed_only_t95.values", "a list of numbers (or nulls)")

    need(isinstance(summary, dict), "the top level", "an object")
    need(_optional_dict(summary.get("algos")), "algos", "an object of algorithms or null")
    for name, algo in (summary.get("algos") or {}).items():
        at = f"algos.{name}"
        need(isinstance(algo, dict), at, "an object")
        need(algo.get("baseline") is None or isinstance(algo["baseline"], str), f"{at}.baseline",
             "a group label or null")
        need(isinstance(algo.get("groups", []), list), f"{at}.groups", "a list of groups")
        for i, g in enumerate(algo.get("groups", [])):
            gat = f"{at}.groups[{i}]"
            need(isinstance(g, dict) and isinstance(g.get("label"), str), f"{gat}.label", "a group label (text)")
            need(isinstance(g.get("metrics", {}), dict), f"{gat}.metrics", "an object of metrics")
            m = g.get("metrics", {}).get(key)
            need(_optional_dict(m), f"{gat}.metrics.{key}", "an object or null")
            need((m or {}).get("mean") is None or _number(m["mean"]), f"{gat}.metrics.{key}.mean", "a number or null")
            n = (m or {}).get("eval_prompts")
            need(n is None or (isinstance(n, int) and not isinstance(n, bool)), f"{gat}.metrics.{key}.eval_prompts",
                 "an integer or null")
            need(_optional_dict(g.get("paired_vs_baseline")), f"{gat}.paired_vs_baseline", "an object or null")
            comparison((g.get("paired_vs_baseline") or {}).get(key), f"{gat}.paired_vs_baseline.{key}")
        within = algo.get("within_sft_start")
        need(_optional_dict(within), f"{at}.within_sft_start", "an object of SFT starts or null")
        for start, inside in (within or {}).items():
            sat = f"{at}.within_sft_start.{start}"
            need(isinstance(inside, dict) and isinstance(inside.get("paired_vs_baseline", {}), dict),
                 f"{sat}.paired_vs_baseline", "an object of groups")
            for label, by_key in inside.get("paired_vs_baseline", {}).items():
                need(isinstance(by_key, dict), f"{sat}.paired_vs_baseline.{label}", "an object of metrics")
                comparison(by_key.get(key), f"{sat}.paired_vs_baseline.{label}.{key}")
