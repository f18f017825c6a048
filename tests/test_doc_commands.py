"""Every ``refexp`` command written in README.md and docs/*.md runs: its command-line checks
(``refexp/cli/errors.py``'s ``precheck``), then the run itself up to the point where a model would be built
(``refexp.run.run``: the config, the task's data checks, the run dir, the task build with its length checks, the
tokenizer against the start), or a dry run's plan. A documented command that cannot run fails here, not in a
user's first minutes.

Small, and no model fetched: the command's files are stand-ins made here (tests/helpers/doc_commands.py: GSM8K-
format rows, preference pairs, a reward function and a reward model, checkpoint dirs whose config.json has the
documented model's shapes beside the tiny Qwen3's tokenizer), ``model.pretrained``'s fetch and conversion returns
such a stand-in, the run stops where ``run`` dispatches to the algorithm (``_dispatch``: the SFT model, then the
algorithm's models), nothing is logged to W&B (``logger=none``), and a task built once is reused by the commands
that build the same one. Task sizes stay as documented: the sizes are what must fit the data. The prompts' token
counts are the tiny tokenizer's, not the real checkpoint's. A sweep (``-m``, or an experiment's
``hydra.sweeper.params``) runs its command-line checks and its first job (every job of a shipped experiment is
composed and validated by tests/test_shipped_configs.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from refexp.cli.compose import hydra_initialized, parse_command_line
from refexp.cli.errors import precheck
from refexp.tasks.splits import TARGET_ALGOS
from tests.helpers.configs import CONF_DIR, compose_root
from tests.helpers.doc_commands import doc_commands, localized, make_files

SKIPPED = {
    "refexp --help": "not a run: Hydra prints the help (tests/test_hydra_app.py runs it)",
    "refexp algo=grpo model=llama3_8b model.hf_assets_path=/models/Llama-3.1-8B-Instruct sft.enable=false "
    "task=gsm8k task.train_path=/data/gsm8k parallelism=fsdp parallelism.nproc_per_node=8 activation_checkpoint=full":
        "multi-GPU only: 8 worker processes, one per GPU, training an 8B checkpoint (its plan is the dry-run command "
        "beside it, run here)",
    "refexp -m hydra/launcher=slurm experiment=compare_refs_grpo model=llama3_8b parallelism=fsdp "
    "parallelism.nproc_per_node=8 ...": "SLURM only, and its '...' stands for overrides the page leaves out",
    "refexp -m hydra/launcher=local_gpus algo=grpo model=qwen3_0.6b ... reference=fixed,periodic_reset,ema,none":
        "one GPU per job (hydra/launcher=local_gpus), and its '...' stands for overrides the page leaves out",
}
"""Commands not run here, each with why. Dry runs of multi-GPU configs are run: a plan needs no GPU."""
SMALL = ["logger=none"]
"""Overrides added to every command (and its run dir, in the test's tmp): nothing reaches W&B (the run stops
before any step)."""

COMMANDS = doc_commands()


class ReachedTheModel(Exception):
    """Raised where ``run`` dispatches to the algorithm: every check before a model is built has passed."""


_BUILT: dict = {}
"""(task config, whether the algorithm trains on the answers, lengths) -> the built Task, shared by the commands
that build the same task (the algorithm enters the build only through ``TARGET_ALGOS``' length check)."""


@pytest.fixture(scope="module")
def doc_files(tmp_path_factory, hf_dir):
    """The working dir the commands run in, holding every file they name; and the SmolLM2 stand-in."""
    from refexp.config import to_object
    from refexp.titan.spec import model_arch

    root = tmp_path_factory.mktemp("doc-commands")
    arch = model_arch(to_object(compose_root()).model, None)
    return root, make_files(root, Path(hf_dir), arch)


@pytest.fixture
def up_to_the_model(doc_files, monkeypatch):
    """``run`` stopped at the model; ``model.pretrained`` resolved to its stand-in; task builds shared."""
    import refexp.tasks as tasks_module

    root, smollm2 = doc_files
    monkeypatch.chdir(root)
    monkeypatch.syspath_prepend(str(root))  # task.reward=mypkg.rewards:score
    monkeypatch.setattr("refexp.components.pretrained.ensure_pretrained", lambda name, cache_dir: smollm2)

    def stop(ctx, status):
        raise ReachedTheModel()

    monkeypatch.setattr("refexp.run._dispatch", stop)
    build = tasks_module.build_task

    def shared_build(task_cfg, cache_dir, *, algo, **lengths):
        key = (repr(dataclasses.asdict(task_cfg)), algo in TARGET_ALGOS, repr(sorted(lengths.items())))
        if key not in _BUILT:
            _BUILT[key] = build(task_cfg, cache_dir, algo=algo, **lengths)
        return _BUILT[key]

    monkeypatch.setattr(tasks_module, "build_task", shared_build)


def _first_job(argv: list[str]) -> tuple:
    """``(command line, overrides of the first job)``: each swept value of the command line and of the
    experiment's ``hydra.sweeper.params`` at its first value (Hydra's basic sweeper runs that job first)."""
    from hydra import compose
    from hydra.core.override_parser.overrides_parser import OverridesParser

    command_line = parse_command_line(argv)
    job = [f"{o.input_line.split('=', 1)[0]}={next(o.sweep_string_iterator())}" if o.is_sweep_override()
           else o.input_line for o in OverridesParser.create().parse_overrides(command_line.job_overrides)]
    with hydra_initialized(str(CONF_DIR), command_line):
        params = compose(command_line.config_name, overrides=job, return_hydra_config=True).hydra.sweeper.get("params")
    set_here = {line.split("=", 1)[0].lstrip("+~") for line in job}
    job += [f"{key}={str(values).split(',')[0]}" for key, values in (params or {}).items() if key not in set_here]
    return command_line, job


def _may_sweep(argv: list[str]) -> bool:
    """Whether the command is a sweep, or may be one: ``-m``, or a config that may set ``hydra.sweeper.params``
    (an experiment, a search)."""
    return any(a in ("-m", "--multirun") or a.split("=")[0] in ("experiment", "hparams_search") for a in argv)


@pytest.mark.parametrize("command", COMMANDS, ids=[f"{c.where}: {c.text}" for c in COMMANDS])
def test_a_documented_command_passes_every_check_before_its_model(command, up_to_the_model, tmp_path, capsys,
                                                                   monkeypatch):
    from hydra import compose

    import refexp.config
    from refexp.cli.dry_run import dry_run
    from refexp.run import run

    if command.text in SKIPPED:
        pytest.skip(SKIPPED[command.text])
    argv = [*localized(command.argv), *SMALL, f"run_dir={tmp_path / 'run'}"]
    checked = []  # the job config the command-line checks validated: the run's own, for a single run
    validate = refexp.config.to_object  # which precheck imports when it runs
    monkeypatch.setattr(refexp.config, "to_object", lambda cfg, **kw: checked.append(cfg) or validate(cfg, **kw))
    try:
        precheck(argv, str(CONF_DIR))
    except SystemExit:
        pytest.fail(f"{command.where}: `{command.text}` fails its command-line checks: {capsys.readouterr().err}")
    if "--cfg" in argv:  # prints the composed config; the checks above are all it runs
        return
    if checked and not _may_sweep(argv):
        dcfg = checked[0]
    else:  # a sweep's first job, or a dry run (whose plan the command-line checks leave to dry_run)
        command_line, job = _first_job(argv)
        with hydra_initialized(str(CONF_DIR), command_line):
            dcfg = compose(command_line.config_name, overrides=job)
    if dcfg.get("dry_run"):
        assert dry_run(dcfg)["per-rank peak estimate"] > 0
        return
    with pytest.raises(ReachedTheModel):
        run(dcfg)


def test_the_skipped_commands_are_still_documented():
    """A skip names a command as written: one that is no longer in the docs must not keep its skip."""
    assert set(SKIPPED) <= {c.text for c in COMMANDS}
