"""A committed report whose runs are kept renders again, under the current report code, to the committed report.md and
summary.json: any change to what a report says (a verdict rule, a test's interval, a sentence) shows here, and is
either a fault or a change to commit with the re-rendered reports (and REPORT_VERSION bumped).

docs/smollm2_grpo is the kept report that renders fastest (six run dirs, a few seconds); its declared equivalence
margin (±0.1) puts TOST's interval in every verdict sentence. Only summary.json's ``rendered_by_commit`` may differ:
it names the checkout that rendered it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from refexp.report import build_report
from refexp.report.reading.archive import ARCHIVE

ROOT = Path(__file__).resolve().parent.parent
KEPT = "docs/smollm2_grpo"
RENDERED = ("report.md", "report.html", "summary.json")


def _summary_without_commit(path: Path) -> dict:
    summary = json.loads(path.read_text())
    summary.pop("rendered_by_commit")
    return summary


def test_a_kept_report_renders_again_to_its_committed_text(tmp_path, monkeypatch):
    committed = ROOT / KEPT
    copy = tmp_path / KEPT
    shutil.copytree(committed, copy, ignore=shutil.ignore_patterns(*RENDERED, "report_plots", ARCHIVE + ".partial"))
    monkeypatch.chdir(tmp_path)  # the report names its sweep dir relative to the working directory: docs/NAME
    build_report(Path(KEPT))
    assert (copy / "report.md").read_text() == (committed / "report.md").read_text(), (
        f"{KEPT}/report.md no longer renders as committed: render it again (refexp-report {KEPT}) if the change is "
        f"meant, and bump REPORT_VERSION")
    assert _summary_without_commit(copy / "summary.json") == _summary_without_commit(committed / "summary.json")
