"""What git holds of the committed reports: what a person reads or a test checks. ``report.html`` (report.md's
content again, its plots embedded as base64) is generated and git-ignored, so no tracked file is one; a report's runs
are kept one way, as one ``runs.tar.xz`` beside a pre-registered study's report within the size cap docs/README.md
states, and no raw run dir lies under docs/."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from refexp.report.reading.archive import ARCHIVE
from refexp.report.reading.load import find_run_dirs

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RUNS_ARCHIVE_CAP_MIB = 16
"""The largest a committed ``runs.tar.xz`` may be (docs/README.md, "Committed reports", states it)."""
SFT_STARTS_CAP_MIB = 48
"""The largest a carried sweep's ``sft_starts.tar.xz`` may be: eight of the 256-wide model's starts (5.6 MiB each as
scripts/carry_sweep.py packs them), as many as frontier_confirm trains."""
PRE_REGISTERED = "pre-registered in the experiment config (its comparison block)"


def tracked_files(root: Path) -> list[str] | None:
    """``git ls-files`` of the checkout at ``root``; None where it is not a git checkout (an sdist, a copy) or git is
    missing."""
    try:
        p = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return [f for f in p.stdout.split("\0") if f] if p.returncode == 0 else None


def tracked_report_pages(files: list[str]) -> list[str]:
    return [f for f in files if Path(f).name == "report.html"]


def test_no_report_html_is_tracked():
    files = tracked_files(ROOT)
    if files is None:
        pytest.skip("not a git checkout")
    assert tracked_report_pages(files) == [], ("report.html is generated (refexp-report writes it) and git-ignored: "
                                               "git rm --cached it")


def test_a_report_html_is_ignored_and_one_forced_in_is_seen(tmp_path):
    """The check above sees a report.html added past .gitignore (``git add -f``), and .gitignore keeps out the one a
    re-render writes."""
    if tracked_files(ROOT) is None:
        pytest.skip("not a git checkout")
    repo = tmp_path / "repo"
    (repo / "docs" / "study").mkdir(parents=True)
    (repo / ".gitignore").write_text((ROOT / ".gitignore").read_text())
    for name in ("report.md", "report.html"):
        (repo / "docs" / "study" / name).write_text("x\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "."], cwd=repo, check=True)
    assert tracked_files(repo) == [".gitignore", "docs/study/report.md"]
    subprocess.run([*git, "add", "-f", "docs/study/report.html"], cwd=repo, check=True)
    assert tracked_report_pages(tracked_files(repo)) == ["docs/study/report.html"]


def test_every_runs_archive_lies_beside_a_pre_registered_report_within_the_cap():
    """A pre-registered report's runs beside it (a pilot's beside its exploratory report, named by the experiment it
    designs); a sweep carried between sittings (``in_progress/``, scripts/carry_sweep.py) beside
    the README that says how to resume it, its SFT starts' archive within the cap too."""
    assert f"{RUNS_ARCHIVE_CAP_MIB} MiB" in (DOCS / "README.md").read_text(), "docs/README.md must state the cap"
    archives = sorted(DOCS.rglob(ARCHIVE))
    assert {a.parent.name for a in archives} >= {"frontier_test", "overoptimization_grpo", "smollm2_grpo"}
    for archive in archives:
        where = archive.relative_to(ROOT)
        if archive.parent.name == "in_progress":
            readme = archive.parent / "README.md"
            assert readme.is_file() and "scripts/carry_sweep.py" in readme.read_text(), (
                f"{where}: a carried sweep needs a README.md beside it saying how to resume it "
                "(scripts/carry_sweep.py)")
            starts = archive.parent / "sft_starts.tar.xz"
            for kept, cap in ((archive, RUNS_ARCHIVE_CAP_MIB), (starts, SFT_STARTS_CAP_MIB)):
                size_mib = kept.stat().st_size / 2**20
                assert size_mib <= cap, f"{kept.relative_to(ROOT)}: {size_mib:.1f} MiB, over the {cap} MiB cap"
            continue
        assert (archive.parent / "report.md").is_file(), f"{where}: no report.md beside it"
        if archive.parent.name == "pilot":  # a design step's pilot: exploratory, named by the experiment it designs
            named = str(archive.parent.relative_to(ROOT))
            assert any(named in p.read_text() for p in (ROOT / "conf" / "experiment").glob("*.yaml")), (
                f"{where}: a pilot's runs, but no conf/experiment file names {named} as its pilot")
        else:
            summary = (archive.parent / "summary.json").read_text()
            assert PRE_REGISTERED in summary, f"{where}: its report is not a pre-registered study's"
        size_mib = archive.stat().st_size / 2**20
        assert size_mib <= RUNS_ARCHIVE_CAP_MIB, f"{where}: {size_mib:.1f} MiB, over the {RUNS_ARCHIVE_CAP_MIB} MiB cap"


def test_runs_are_kept_only_as_an_archive():
    raw = [str(d.relative_to(ROOT)) for d in find_run_dirs(DOCS)]
    assert raw == [], f"run dirs under docs/: pack them (python -m refexp.report.pack_runs SWEEP docs/NAME): {raw}"
