"""A committed report whose runs are not stored beside it (no ``runs.tar.xz``, no run dirs): a notice at the top of
its report.md and report.html saying which report version rendered it, and ``report_version`` in its summary.json (0
where it has none: rendered before the number existed), written through ``refexp.report.version.rendered_by`` as a
fresh report's is. The notice and summary.json's ``runs_kept: false`` keep the words committed reports already
carry ("runs not kept").

    python -m refexp.report.writing.runs_not_stored docs/quickstart docs/frontier_grpo ...

Such a report cannot be rendered again, so it is marked rather than edited by hand: its numbers and words are
those of the rules in force when it was rendered, but for one mechanical reprint the notice names: an interval on a
difference of proportions that reaches past ±1 (a t over 1 or 2 degrees of freedom) says nothing a reader can use,
so it is printed as "uninformative", as a current report prints it (``statistics.inference.Verdict.interval_text``).
Every interval in a committed report is on a proportion (accuracy, retention, preference accuracy, pass@k).
Marking again replaces the notice, never stacks it.
"""

from __future__ import annotations

import html
import json
import re
import sys
from pathlib import Path

from refexp.record.atomic import write_text_atomic
from refexp.report.version import rendered_by

NOTICE = "Rendered by report version {version} under the rules then in force; runs not kept."
REPRINTED = ("{n} intervals reaching past ±1 on a difference of proportions are reprinted as \"uninformative\", "
             "as the current report code prints them.")
_MD_NOTICE = re.compile(r"\A> \*\*Rendered by report version \d+ under the rules then in force; runs not kept\.\*\*"
                        r"(?: (\d+) intervals reaching past [^\n]*)?\n\n")
_HTML_NOTICE = re.compile(r'<p class="not-kept"><strong>Rendered by report version \d+ [^<]*</strong></p>\n')
_INTERVAL = re.compile(r"\[([+\-−]?\d+\.\d+), ([+\-−]?\d+\.\d+)\]")


def reprint_out_of_range(text: str) -> tuple[str, int]:
    """``text`` with every interval "[a, b]" whose bound lies past ±1 replaced by "uninformative", and how many."""
    count = 0

    def reprint(match: re.Match) -> str:
        nonlocal count
        low, high = (float(g.replace("−", "-")) for g in match.groups())
        if low < -1 or high > 1:
            count += 1
            return "uninformative"
        return match.group(0)

    return _INTERVAL.sub(reprint, text), count


def notice(version: int) -> str:
    return NOTICE.format(version=version)


def version_of(summary: dict) -> int:
    """The report version a summary was rendered by: its ``report_version``, 0 without one."""
    return int(summary.get("report_version", 0))


def mark_runs_not_stored(report_dir: Path) -> int:
    """Mark the report in ``report_dir`` (summary.json, report.md, report.html where there is one) as one whose runs
    are not stored; returns the version it was rendered by. Raises FileNotFoundError naming a missing file."""
    report_dir = Path(report_dir)
    paths = {name: report_dir / name for name in ("summary.json", "report.md", "report.html")}
    for name in ("summary.json", "report.md"):
        if not paths[name].is_file():
            raise FileNotFoundError(f"{paths[name]}: not found; a report dir holds summary.json and report.md "
                                    f"(report.html too, where it was written)")
    summary = json.loads(paths["summary.json"].read_text(encoding="utf-8"))
    version = version_of(summary)
    commit = summary.get("rendered_by_commit")
    summary = {**rendered_by(version, commit), **summary, "runs_kept": False}
    write_text_atomic(paths["summary.json"], json.dumps(summary, indent=2, allow_nan=False) + "\n", encoding="utf-8")

    md = paths["report.md"].read_text(encoding="utf-8")
    prior = _MD_NOTICE.match(md)  # marked before: the intervals it counted already read "uninformative"
    md, reprinted = reprint_out_of_range(_MD_NOTICE.sub("", md, count=1))
    reprinted += int(prior.group(1)) if prior and prior.group(1) else 0
    extra = " " + REPRINTED.format(n=reprinted) if reprinted else ""
    write_text_atomic(paths["report.md"], f"> **{notice(version)}**{extra}\n\n" + md, encoding="utf-8")
    if not paths["report.html"].is_file():
        return version
    page = _HTML_NOTICE.sub("", paths["report.html"].read_text(encoding="utf-8"), count=1)
    page, _ = reprint_out_of_range(page)
    head, body, rest = page.partition("<body>")
    if not body:
        raise ValueError(f"{paths['report.html']}: no <body> tag to put the notice after")
    marked = f'<p class="not-kept"><strong>{html.escape(notice(version) + extra)}</strong></p>\n'
    write_text_atomic(paths["report.html"], head + body + "\n" + marked + rest.removeprefix("\n"), encoding="utf-8")
    return version


def main(argv: list[str] | None = None) -> int:
    dirs = sys.argv[1:] if argv is None else argv
    if not dirs:
        print("usage: python -m refexp.report.writing.runs_not_stored REPORT_DIR [REPORT_DIR ...]", file=sys.stderr)
        return 2
    for d in dirs:
        print(f"{d}: report version {mark_runs_not_stored(Path(d))}, marked runs not kept")
    return 0


if __name__ == "__main__":
    sys.exit(main())
