"""A sweep's runs kept as one runs.tar.xz beside its report (refexp/report/reading/archive.py): the report renders
from the archive as from the run dirs, the archive leaves out checkpoints and W&B files and is the same bytes for
the same runs; a member that is a link or a path out of the dir, one past the size caps, a file that is no xz tar and
one cut short are each one ArchiveError line before the report reads anything; run dirs beside an archive are read,
not the archive."""

from __future__ import annotations

import io
import json
import shutil
import tarfile

import pytest

from refexp.report import build_report
from refexp.report.__main__ import main as report_main
from refexp.report.pack_runs import main as pack_main
from refexp.report.reading import archive
from refexp.report.reading.archive import ARCHIVE, ArchiveError, pack
from tests.helpers.report_sweep import make_sweep


def _numbers(summary_path) -> dict:
    s = json.loads(summary_path.read_text())
    s.pop("sweep_dir")
    return s


def test_a_report_renders_from_the_archive_as_from_the_run_dirs(tmp_path):
    make_sweep(tmp_path / "sweep")
    (tmp_path / "sweep" / "0" / "checkpoint").mkdir()
    (tmp_path / "sweep" / "0" / "checkpoint" / "weights.bin").write_bytes(b"\0" * 1000)
    (tmp_path / "sweep" / "0" / "wandb").mkdir()
    (tmp_path / "sweep" / "0" / "wandb" / "run.wandb").write_bytes(b"x")
    direct = build_report(tmp_path / "sweep", baseline="fixed")
    assert pack_main([str(tmp_path / "sweep"), str(tmp_path / "docs")]) == 0
    names = tarfile.open(tmp_path / "docs" / ARCHIVE).getnames()
    assert {"0/status.json", "0/metrics.jsonl", "0/.hydra/overrides.yaml"} <= set(names)
    assert not [n for n in names if "checkpoint" in n or "wandb" in n or n.endswith(("report.md", "summary.json"))]
    from_archive = build_report(tmp_path / "docs", baseline="fixed")
    assert _numbers(from_archive.summary_path) == _numbers(direct.summary_path)
    assert [r.name for r in from_archive.runs] == [r.name for r in direct.runs]
    assert sorted(p.name for p in (tmp_path / "docs").iterdir()) == sorted(
        [ARCHIVE, "report.md", "report.html", "summary.json", "report_plots"])  # nothing extracted stays behind


def test_the_same_runs_give_the_same_archive(tmp_path):
    make_sweep(tmp_path / "sweep")
    first = pack(tmp_path / "sweep", tmp_path / "a").read_bytes()
    (tmp_path / "sweep" / "0" / "status.json").touch()  # a newer mtime: not recorded
    assert pack(tmp_path / "sweep", tmp_path / "b").read_bytes() == first


def test_packing_a_dir_without_runs_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no run dir"):
        pack(tmp_path / "empty", tmp_path / "out")
    assert not (tmp_path / "out" / ARCHIVE).exists()


@pytest.mark.parametrize("member", ["../outside.txt", "link"])
def test_an_archive_member_out_of_the_dir_or_a_link_is_refused(tmp_path, member):
    docs = tmp_path / "docs" / "inner"
    docs.mkdir(parents=True)
    with tarfile.open(docs / ARCHIVE, "w:xz") as tar:
        status = json.dumps({"status": "completed"}).encode()
        info = tarfile.TarInfo("0/status.json")
        info.size = len(status)
        tar.addfile(info, io.BytesIO(status))
        bad = tarfile.TarInfo(member)
        if member == "link":
            bad.type, bad.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(bad)
        else:
            bad.size = 3
            tar.addfile(bad, io.BytesIO(b"bad"))
    with pytest.raises(ArchiveError, match=f"runs.tar.xz: member '{member}' refused .*: an archive of runs holds "
                                           f"only files and dirs inside it$"):
        build_report(docs)
    assert not (tmp_path / "docs" / "outside.txt").exists() and not (docs / "report.md").exists()


def _archive_of(tmp_path, files: dict[str, bytes]):
    """A dir holding only a runs.tar.xz of ``files`` (name -> bytes)."""
    docs = tmp_path / "docs"
    docs.mkdir()
    with tarfile.open(docs / ARCHIVE, "w:xz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return docs


def _refused(docs, capsys, match: str) -> None:
    """The report refuses ``docs`` in one line naming its archive, exit 2, nothing written."""
    with pytest.raises(ArchiveError, match=match):
        build_report(docs)
    assert report_main([str(docs), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"refexp-report: error: {docs / ARCHIVE}: ") and err.count("\n") == 1, err
    assert sorted(p.name for p in docs.iterdir()) == [ARCHIVE]


def test_a_member_past_the_size_cap_is_refused_before_it_is_written(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(archive, "MAX_MEMBER_BYTES", 1000)
    docs = _archive_of(tmp_path, {"0/status.json": b"{}", "0/metrics.jsonl": b"\n" * 1001})
    _refused(docs, capsys, r"member '0/metrics.jsonl' holds 1,001 bytes, more than the 1,000 a run's file may")


def test_an_archive_that_extracts_past_its_total_cap_is_refused(tmp_path, capsys, monkeypatch):
    # 3 MB of zeros pack to a few hundred bytes: past 100x the archive's size once over the floor (here 1 MB)
    monkeypatch.setattr(archive, "RATIO_FLOOR", 2**20)
    docs = _archive_of(tmp_path, {"0/status.json": b"{}", **{f"0/f{i}": b"\0" * 2**20 for i in range(3)}})
    limit = max(2**20, 100 * (docs / ARCHIVE).stat().st_size)
    _refused(docs, capsys, f"its members hold more than {limit:,} bytes")
    assert archive._limit(docs / ARCHIVE) == limit < 2 * 2**20


def test_the_size_caps_admit_the_committed_archives():
    # docs/frontier_test: 14.4 MB extracting to 193 MB, its largest file 0.25 MB (read from its headers once)
    assert archive.MAX_MEMBER_BYTES > 100 * 253_504
    assert min(archive.MAX_TOTAL_BYTES, archive.MAX_RATIO * 14_383_476) > 5 * 192_878_919


def test_a_file_that_is_no_xz_tar_is_refused(tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / ARCHIVE).write_text("not an archive\n")
    _refused(docs, capsys, "runs.tar.xz: not a readable xz tar archive .*; expected the runs.tar.xz")


def test_an_archive_cut_short_is_refused(tmp_path, capsys):
    make_sweep(tmp_path / "sweep")
    whole = pack(tmp_path / "sweep", tmp_path / "whole").read_bytes()
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / ARCHIVE).write_bytes(whole[: len(whole) // 2])
    _refused(docs, capsys, "runs.tar.xz: (cut short or corrupt|not a readable xz tar archive) .*; expected the")


def test_run_dirs_beside_an_archive_are_read_not_the_archive(tmp_path):
    """An archive packed into the sweep dir, then a run dir removed: the report reads the dirs (one run fewer),
    never the stale archive's runs."""
    sweep = tmp_path / "sweep"
    make_sweep(sweep)
    pack(sweep, sweep)
    with tarfile.open(sweep / ARCHIVE) as tar:
        archived_runs = {n.split("/")[0] for n in tar.getnames()}
    shutil.rmtree(sweep / "0")
    report = build_report(sweep, baseline="fixed")
    assert "0" in archived_runs and len(report.runs) == 17 and "0" not in {r.name for r in report.runs}
