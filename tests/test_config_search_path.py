"""Config groups found through Hydra's search path (``--config-dir DIR``, ``hydra.searchpath=[file://DIR]``) are
accepted by refexp's checks before a run (refexp/cli/errors.py through refexp/cli/compose.py), as Hydra composes
them; a truly unknown option is still one line listing what Hydra can see."""

from __future__ import annotations

import subprocess
import sys

import pytest

from refexp.__main__ import CONF_DIR
from refexp.cli.errors import precheck


@pytest.fixture
def user_conf(tmp_path):
    """A config dir outside the package: an experiment and a training option of its own."""
    conf = tmp_path / "myconf"
    (conf / "experiment").mkdir(parents=True)
    (conf / "experiment" / "myexp.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /training: short\nexperiment_name: myexp_outside\n")
    (conf / "training").mkdir()
    (conf / "training" / "short.yaml").write_text("defaults:\n  - default\nsteps: 7\n")
    return conf


@pytest.mark.parametrize("how", ["--config-dir", "-cd", "hydra.searchpath"])
def test_an_experiment_outside_the_package_passes_the_checks(user_conf, tmp_path, how):
    where = [f"hydra.searchpath=[file://{user_conf}]"] if how == "hydra.searchpath" else [how, str(user_conf)]
    precheck([*where, "experiment=myexp", "algo=grpo", f"hydra.run.dir={tmp_path / 'run'}"], CONF_DIR)  # no exit


def test_an_unknown_option_lists_the_options_on_the_search_path(user_conf, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        precheck(["--config-dir", str(user_conf), "experiment=nope", f"hydra.run.dir={tmp_path / 'run'}"], CONF_DIR)
    assert exit_.value.code == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("refexp: error: experiment=nope is not an option of experiment/: expected one of ")
    assert "myexp" in line and "quickstart" in line and "\n" not in line
    with pytest.raises(SystemExit):  # without the search path, the outside experiment is unknown
        precheck(["experiment=myexp", f"hydra.run.dir={tmp_path / 'run'}"], CONF_DIR)


def test_the_cli_composes_the_outside_experiment(user_conf, tmp_path):
    out = subprocess.run([sys.executable, "-m", "refexp", "--config-dir", str(user_conf), "experiment=myexp",
                          f"hydra.run.dir={tmp_path / 'run'}", "--cfg", "job"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "experiment_name: myexp_outside" in out.stdout and "  steps: 7\n" in out.stdout
