"""Which report code rendered a report: summary.json's ``report_version`` and ``rendered_by_commit``, the committed
reports under docs/ (every one says its version; one whose runs are not kept says so at its top; one whose runs are
in the repo was rendered by the current version), and the marker that writes the notice."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from refexp.record.provenance import _git_commit, provenance
from refexp.report import build_report
from refexp.report.reading.archive import ARCHIVE
from refexp.report.reading.load import load_sweep
from refexp.report.version import REPORT_VERSION
from refexp.report.writing import runs_not_stored
from tests.helpers.report_sweep import make_sweep

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = sorted(p.parent for p in (ROOT / "docs").rglob("summary.json"))


def runs_in_reach(report_dir: Path) -> bool:
    """Whether the runs a committed report was rendered from are in the repo: run dirs below the report's own dir,
    its ``runs.tar.xz`` (refexp/report/reading/archive.py), or its ``sweep_dir`` (as the report shows it, relative
    to the checkout) holding runs."""
    sweep = json.loads((report_dir / "summary.json").read_text())["sweep_dir"]
    return (report_dir / ARCHIVE).is_file() or any(d.is_dir() and load_sweep(d) for d in (report_dir, ROOT / sweep))


def test_there_are_committed_reports():
    assert len(COMMITTED) >= 8, COMMITTED


@pytest.mark.parametrize("report_dir", COMMITTED, ids=lambda p: p.relative_to(ROOT / "docs").as_posix())
def test_a_committed_report_says_which_version_rendered_it(report_dir):
    summary = json.loads((report_dir / "summary.json").read_text())
    assert isinstance(summary.get("report_version"), int), f"{report_dir}/summary.json has no report_version"
    version = summary["report_version"]
    if runs_in_reach(report_dir):
        assert version == REPORT_VERSION, (f"{report_dir}: rendered by report version {version}, the code is at "
                                           f"{REPORT_VERSION}: render it again (refexp-report SWEEP)")
        return
    top = f"> **{runs_not_stored.notice(version)}**"
    first = (report_dir / "report.md").read_text().split("\n\n", 1)[0]
    assert first == top or first.startswith(top + " "), f"{report_dir}/report.md lacks the notice"
    if (report_dir / "report.html").is_file():
        page = (report_dir / "report.html").read_text()
        assert f'<body>\n<p class="not-kept"><strong>{runs_not_stored.notice(version)}' in page
    assert summary["runs_kept"] is False


@pytest.mark.parametrize("report_dir", COMMITTED, ids=lambda p: p.relative_to(ROOT / "docs").as_posix())
def test_no_committed_report_prints_an_interval_past_the_range_of_a_difference_of_proportions(report_dir):
    """Every interval a committed report prints is on a proportion; one past ±1 (a t over 1 or 2 df) prints as
    "uninformative", in the old reports through the marker's reprint (their notice says how many)."""
    for name in ("report.md", "report.html"):
        if (report_dir / name).is_file():
            text = (report_dir / name).read_text()
            assert runs_not_stored.reprint_out_of_range(text)[1] == 0, f"{report_dir}/{name} prints an interval past ±1"


def test_the_reprint_replaces_only_intervals_past_plus_minus_1_and_the_notice_counts_them_once(tmp_path):
    text, n = runs_not_stored.reprint_out_of_range("a [-48.444, +47.812] b [−0.316, +0.105] c [+0.2, 1.5]")
    assert (text, n) == ("a uninformative b [−0.316, +0.105] c uninformative", 2)
    old = tmp_path / "old"
    shutil.copytree(ROOT / "docs" / "quickstart", old)
    (old / "report.md").write_text("# r\n\ncell -0.316 [-48.444, +47.812] not separated\n")
    for _ in range(2):  # marking again keeps the count of the intervals reprinted the first time
        runs_not_stored.mark_runs_not_stored(old)
        md = (old / "report.md").read_text()
        assert md.startswith(f"> **{runs_not_stored.notice(0)}** 1 intervals reaching past ±1")
        assert md.count("> **") == 1
        assert md.endswith("cell -0.316 uninformative not separated\n")


def test_a_fresh_report_records_the_current_version_and_commit(tmp_path, monkeypatch):
    make_sweep(tmp_path / "s")
    build_report(tmp_path / "s")
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert summary["report_version"] == REPORT_VERSION
    assert summary["rendered_by_commit"] == provenance()["commit"]
    assert "runs_kept" not in summary

    assert _git_commit(tmp_path) is None  # outside a git checkout: no commit, no error
    monkeypatch.setattr("refexp.report.version.provenance", lambda: {"commit": _git_commit(tmp_path)})
    build_report(tmp_path / "s")
    assert json.loads((tmp_path / "s" / "summary.json").read_text())["rendered_by_commit"] is None


def test_the_commit_is_read_before_the_report_rewrites_its_own_files(tmp_path, monkeypatch):
    # A committed report rendered again from a clean checkout rewrites its own tracked files; the commit must be read
    # before that, or it reads "-dirty". The stand-in checkout is dirty once the report's report.md is newer than
    # the build's start.
    sweep = tmp_path / "s"
    make_sweep(sweep)
    build_report(sweep)
    started = (sweep / "report.md").stat().st_mtime_ns + 1

    def checkout():
        written = (sweep / "report.md").stat().st_mtime_ns >= started
        return {"commit": "abc123" + ("-dirty" if written else "")}

    monkeypatch.setattr("refexp.report.version.provenance", checkout)
    build_report(sweep)
    assert json.loads((sweep / "summary.json").read_text())["rendered_by_commit"] == "abc123"


def test_marking_an_old_report_writes_version_0_and_one_notice(tmp_path):
    old = tmp_path / "old"
    shutil.copytree(ROOT / "docs" / "quickstart", old)
    # report.html is not committed (git-ignored): a page of the shape refexp-report writes, for the notice to go in
    (old / "report.html").write_text("<!doctype html>\n<html><head><title>r</title></head><body>\n<h1>r</h1>\n"
                                     "</body></html>\n")
    summary = json.loads((old / "summary.json").read_text())
    for key in ("report_version", "rendered_by_commit", "runs_kept"):  # as it was before the field existed
        summary.pop(key, None)
    (old / "summary.json").write_text(json.dumps(summary, indent=2))
    body = (old / "report.md").read_text().split("\n\n", 1)[1]
    (old / "report.md").write_text(body)

    assert runs_not_stored.mark_runs_not_stored(old) == 0
    assert runs_not_stored.mark_runs_not_stored(old) == 0  # again: replaced, not stacked
    marked = json.loads((old / "summary.json").read_text())
    assert list(marked)[:2] == ["report_version", "rendered_by_commit"] and marked["report_version"] == 0
    md = (old / "report.md").read_text()
    assert md == "> **Rendered by report version 0 under the rules then in force; runs not kept.**\n\n" + body
    assert (old / "report.html").read_text().count('class="not-kept"') == 1
