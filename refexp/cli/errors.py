"""Bad command lines as one line ``refexp: error: ...`` (exit status 2), before torch is imported.

Hydra reports a composition error (an unknown option or field, a malformed override) in several lines and
exits 1; refexp's own checks (``refexp.config``) raise ``ConfigError``. ``precheck`` composes a single
run's command line once with Hydra's compose API (a fraction of a second) and validates it, so both kinds
surface as one line naming the field and what would be valid, whether the run would start or only print
its config (``--cfg job``). Sweeps (``-m``) are left to Hydra: a job's bad values are recorded in its
``status.json`` and the sweep goes on. One check covers a sweep too: a search (``hparams_search``, any
sweeper that selects on the jobs' results) needs a validation split (``precheck_search``), since it must
never select on test. A run dir or sweep dir that cannot be made or written (a name too long, a place no one
may write) is named in one line too (``check_run_dirs``, ``check_sweep_dir``), and so is an override Hydra's
grammar cannot read or would sweep in a single run (``check_override_syntax``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from refexp.choices import renamed_field_hint
from refexp.cli.compose import CommandLine, hydra_initialized, parse_command_line

NOT_A_RUN = ("--help", "-h", "--hydra-help", "--version", "-sc", "--shell-completion", "--info", "-i")
"""Flags after which Hydra does not compose the job's config: nothing to check."""


def hydra_message_line(message: str) -> str:
    """Hydra's multi-line composition message as one line naming the field and what would be valid."""
    text = str(message).strip()
    full = re.search(r"full_key: (\S+)", text)
    missing = re.search(r"Could not find '([^']+)/([^']+)'", text)
    options = re.search(r"Available options in '[^']+':\s*\n((?:\s+\S+\n?)+)", text)
    if missing:
        group, option = missing.groups()
        valid = ", ".join(options.group(1).split()) if options else "see refexp --help"
        return f"{group}={option} is not an option of {group}/: expected one of {valid}"
    conversion = re.search(r"Value '([^']*)' of type '\w+' could not be converted to (\w+)", text)
    if conversion and full:
        return f"{full.group(1)}={conversion.group(1)!r} is invalid: expected a {conversion.group(2).lower()}"
    key = re.search(r"Key '([^']+)' not in '([^']+)'", text)
    if key:
        name = full.group(1) if full else key.group(1)
        return (f"{name} is not a field of {key.group(2)}{renamed_field_hint(name)} (refexp --help lists the groups "
                f"and common fields; refexp --cfg job prints every field)")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("Set the environment")]
    return "; ".join(lines[:3]) if lines else text


def precheck(argv: list[str], config_dir: str) -> None:
    """Compose and validate the single run ``argv`` describes; exit 2 with one line when it is invalid."""
    if any(a.split("=")[0] in NOT_A_RUN for a in argv):
        return
    command_line = parse_command_line(argv)
    if command_line.config_path is not None:
        return  # another primary config dir: Hydra reports its own errors
    multirun = any(a in ("-m", "--multirun") for a in argv)
    check_override_syntax(command_line.overrides, multirun=multirun)
    # A single run's overrides hold no sweep (check_override_syntax): one composition with Hydra's own node serves
    # the search check, the run dirs and, that node dropped, the job's config (as Hydra's compose API drops it), where
    # each composed its own (a second or more of every command's start)
    full = None if multirun else composed_with_hydra(command_line, config_dir, command_line.overrides)
    precheck_search(command_line, config_dir, composed=full)
    if multirun:
        check_sweep_dir(command_line, config_dir)
        return
    from hydra import compose
    from hydra.errors import HydraException
    from omegaconf import open_dict
    from omegaconf.errors import OmegaConfBaseException

    from refexp.config import ConfigError, to_object
    from refexp.config.model import planned_world_size, resolve_shard_degree

    try:
        hydra_dir = run_dir_of(full) if full is not None else None
        if full is not None:
            cfg = full
            with open_dict(cfg):
                del cfg["hydra"]
        else:  # Hydra refused a hydra.* override (it reports that itself) or the job's: the job's error, in one line
            with hydra_initialized(config_dir, command_line):
                cfg = compose(command_line.config_name, overrides=command_line.job_overrides)
        check_run_dirs(command_line, config_dir, cfg.get("run_dir"), hydra_dir=hydra_dir, composed=full is not None)
        if cfg.get("dry_run"):
            return  # a plan needs no data paths (refexp/cli/dry_run.py validates what it needs)
        obj = to_object(cfg)
        world = planned_world_size(obj.parallelism)
        if world is not None and world > 1:
            resolve_shard_degree(obj.parallelism, world)
    except ConfigError as e:
        fail(str(e))
    except (HydraException, OmegaConfBaseException) as e:
        causes = [e]
        while causes[-1].__cause__ is not None:  # "Could not override" wraps OmegaConf's "Key ... not in ..."
            causes.append(causes[-1].__cause__)
        fail(hydra_message_line("\n".join(str(c) for c in reversed(causes))))


def composed_with_hydra(command_line: CommandLine, config_dir: str, overrides: list[str]):
    """The config of ``overrides`` with Hydra's own node (``hydra.*``); None where Hydra refuses to compose it."""
    from hydra import compose

    try:
        with hydra_initialized(config_dir, command_line):
            return compose(command_line.config_name, overrides=overrides, return_hydra_config=True)
    except Exception:  # Hydra, the job's check or each job reports it
        return None


def run_dir_of(composed) -> str | None:
    """``hydra.run.dir`` of a config composed with Hydra's node, None where it does not resolve."""
    try:
        return str(composed.hydra.run.dir)
    except Exception:  # Hydra reports its own errors
        return None


def check_run_dirs(command_line: CommandLine, config_dir: str, run_dir: str | None, *, hydra_dir: str | None = None,
                   composed: bool = False) -> None:
    """Exit 2 with one line naming the path when the run's directories (``hydra.run.dir``, where Hydra
    writes ``.hydra/``, and ``run_dir`` when set) cannot be made or written (Hydra would print a traceback),
    or are being written by another process (``refexp/run.py`` takes their lock).
    Creates the missing parents (Hydra would), never the run dir itself (its name may hold a timestamp).
    ``composed``: ``hydra_dir`` is the command line's ``hydra.run.dir`` already (else it is composed here)."""
    if not composed:
        full = composed_with_hydra(command_line, config_dir, command_line.overrides)
        hydra_dir = run_dir_of(full) if full is not None else None
    from refexp.record import layout
    from refexp.record.lock import held_by
    from refexp.record.status import run_dir_busy

    for d in (hydra_dir, run_dir):
        if d is not None:
            problem = run_dir_problem(Path(str(d)))
            if problem:
                fail(f"cannot use the run dir {d}: {problem}")
            owner = held_by(layout.path(d, layout.LOCK))  # before Hydra writes .hydra/ into it (run.py locks it)
            if owner is not None:
                fail(run_dir_busy(d, owner))


def check_override_syntax(overrides: list[str], *, multirun: bool) -> None:
    """Exit 2 with one line for an override Hydra's grammar cannot read (an unquoted value with a character it
    does not take: a non-ASCII letter, a space), or, in a single run, one Hydra reads as a list of values to sweep
    (an unquoted ','); Hydra would print several lines and exit 1. Either is valid quoted: ``key='value'``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for override in overrides:
        key, _, value = override.partition("=")
        quoted = f"{key}='{value}'"
        try:
            parsed = parser.parse_override(override)
        except HydraException:
            fail(f"{override} is not an override Hydra can read: an unquoted value holds ASCII letters, digits and "
                 f"_-+./:@ (no ',', space or non-ASCII letter); quote it: {quoted}")
        if not multirun and parsed.is_sweep_override():
            fail(f"{override} is a list of values to sweep (its ','), not one value: quote it ({quoted}) for one value "
                 f"holding a comma, or add -m to sweep")


def check_sweep_dir(command_line: CommandLine, config_dir: str) -> None:
    """Exit 2 with one line naming the path when a sweep's dir (``hydra.sweep.dir``) cannot be made or written
    (Hydra would print a traceback once its first job starts)."""
    from hydra import compose
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(command_line.overrides)
        with hydra_initialized(config_dir, command_line):
            sweep_dir = compose(command_line.config_name, return_hydra_config=True,
                                overrides=[o.input_line for o in parsed if not o.is_sweep_override()]).hydra.sweep.dir
    except Exception:  # Hydra reports its own errors
        return
    problem = run_dir_problem(Path(str(sweep_dir)))
    if problem:
        fail(f"cannot use the sweep dir {sweep_dir}: {problem}")


def name_problem(path: Path) -> str | None:
    """Why the file system refuses the name ``path`` (a component longer than NAME_MAX, the whole longer than
    PATH_MAX, as the nearest existing ancestor's file system states them), else None."""
    import os

    existing = next((p for p in [path, *path.parents] if os.path.isdir(p)), Path("/"))
    name_max, path_max = os.pathconf(existing, "PC_NAME_MAX"), os.pathconf(existing, "PC_PATH_MAX")
    for part in path.parts:
        if len(os.fsencode(part)) > name_max:
            return (f"its name {part[:24]}... is {len(os.fsencode(part))} bytes, longer than the {name_max} a name "
                    f"may have here: expected a shorter name")
    if len(os.fsencode(str(path.absolute()))) >= path_max:
        return f"the path is longer than the {path_max} bytes a path may have here: expected a shorter path"
    return None


def run_dir_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a run dir (a name too long, not a directory, or its parent cannot be written),
    else None."""
    import tempfile

    too_long = name_problem(path)
    if too_long:
        return too_long
    if path.exists() and not path.is_dir():
        return "it exists and is not a directory"
    where = path if path.is_dir() else path.parent
    try:
        where.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryDirectory(dir=where).cleanup()  # a probe: can a directory be made (and removed) there?
    except OSError as e:
        return f"cannot create a directory in {where} ({e.strerror or e})"
    return None


def precheck_search(command_line: CommandLine, config_dir: str, composed=None) -> None:
    """Exit 2 with one line when ``argv`` is a search whose task has no validation split
    (``refexp.config.check_search_validation``). Composed from the overrides every trial shares (a swept
    value, ``a=1,2`` or ``choice(...)``, is each trial's own); a search that sweeps the validation fields
    themselves, or a command line Hydra will reject anyway, is left to the trials and to Hydra. ``composed``: a
    single run's config with Hydra's node (``composed_with_hydra``: no override is swept), else composed here."""
    from hydra import compose
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from refexp.config import ConfigError, check_search_validation
    from refexp.config.search import VALIDATION_FIELDS

    try:
        parsed = OverridesParser.create().parse_overrides(command_line.overrides)
        if composed is not None:
            cfg = composed
        else:
            with hydra_initialized(config_dir, command_line):
                cfg = compose(command_line.config_name,
                              overrides=[o.input_line for o in parsed if not o.is_sweep_override()],
                              return_hydra_config=True)
        sweeper = str(cfg.hydra.sweeper.get("_target_", ""))
        swept = {o.key_or_group for o in parsed if o.is_sweep_override()} | set(cfg.hydra.sweeper.get("params") or {})
        if cfg.get("dry_run") or swept & set(VALIDATION_FIELDS):
            return
        task = OmegaConf.to_object(cfg.task)
    except Exception:  # this check must never stop a command line that Hydra would run
        return  # reported by the single-run check below, by Hydra, or by each job
    try:
        check_search_validation(sweeper, task)
    except ConfigError as e:
        fail(str(e))


def fail(message: str) -> None:
    print(f"refexp: error: {message}", file=sys.stderr)
    sys.exit(2)
