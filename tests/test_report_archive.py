"""A sweep's runs kept as one runs.tar.xz beside its report (refexp/report/reading/archive.py): the report renders
from the archive as from the run dirs, the archive leaves out checkpoints and W&B files and is the same bytes for
the same runs, and a member that is a link or a path out of the dir is refused before the report reads anything."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from refexp.report import build_report
from refexp.report.pack_runs import main as pack_main
from refexp.report.reading.archive import ARCHIVE, pack
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
    with pytest.raises(tarfile.FilterError):
        build_report(docs)
    assert not (tmp_path / "docs" / "outside.txt").exists() and not (docs / "report.md").exists()
