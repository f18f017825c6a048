"""Run and sweep dirs the file system or Hydra's grammar refuses are one ``refexp: error:`` line saying what is valid
(refexp/cli/errors.py), not an OSError traceback or Hydra's several lines; the quoted forms are accepted."""

from __future__ import annotations

import pytest

from refexp.__main__ import CONF_DIR
from refexp.cli.errors import precheck

LONG = "a" * 300


@pytest.mark.parametrize("argv, says", [
    ([f"hydra.run.dir={{tmp}}/{LONG}", "dry_run=true"], "cannot use the run dir {tmp}/aaa"),
    ([f"run_dir={{tmp}}/{LONG}", "algo=grpo", "hydra.run.dir={tmp}/h"], "cannot use the run dir {tmp}/aaa"),
    (["hydra.run.dir={tmp}/a,b", "dry_run=true"],
     "hydra.run.dir={tmp}/a,b is a list of values to sweep (its ','), not one value: quote it "
     "(hydra.run.dir='{tmp}/a,b')"),
    (["hydra.run.dir={tmp}/runs/é", "dry_run=true"],
     "hydra.run.dir={tmp}/runs/é is not an override Hydra can read: an unquoted value holds ASCII letters"),
    (["-m", "hydra.sweep.dir=/proc/refexp-no", "training.seed=0,1", "dry_run=true"],
     "cannot use the sweep dir /proc/refexp-no: cannot create a directory in /proc"),
])
def test_a_refused_dir_is_one_line_saying_what_is_valid(tmp_path, capsys, argv, says):
    with pytest.raises(SystemExit) as exit_:
        precheck([a.format(tmp=tmp_path) for a in argv], CONF_DIR)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"refexp: error: {says.format(tmp=tmp_path)}"), err
    if LONG in argv[0]:
        assert "is 300 bytes, longer than the 255 a name may have here" in err
    assert not [p for p in tmp_path.rglob("*") if p.name not in ("h",)]  # nothing made


@pytest.mark.parametrize("name", ["'{tmp}/a,b'", "'{tmp}/runs/é'"])
def test_the_quoted_forms_are_accepted(tmp_path, name):
    precheck([f"hydra.run.dir={name.format(tmp=tmp_path)}", "dry_run=true"], CONF_DIR)  # no exit
