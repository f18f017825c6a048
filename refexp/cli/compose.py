"""Hydra's compose API over the config search path the ``refexp`` app itself would use for a command line, so
that the one-line checks before a run (``cli/errors.py``) see every option Hydra will: the package's ``conf/``,
a ``--config-dir DIR`` (prepended before the structured schemas, as ``hydra._internal.utils._run_hydra`` adds
it) and ``hydra.searchpath=[...]`` (kept among the overrides: Hydra's config loader reads it from them,
``ConfigLoaderImpl._process_config_searchpath``).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

SEARCHPATH = "hydra.searchpath"


@dataclass
class CommandLine:
    overrides: list[str]
    """Every override as Hydra parsed it (the job's and ``hydra.*``)."""
    config_dir: Optional[str]
    """``--config-dir`` / ``-cd``, made absolute; None when not given."""
    config_name: str
    """``--config-name`` / ``-cn``; ``config`` unless given."""
    config_path: Optional[str]
    """``--config-path`` / ``-cp``: another primary config dir (the checks then leave the command line to Hydra)."""

    @property
    def job_overrides(self) -> list[str]:
        """The job's overrides and the search path; Hydra's other settings (``hydra.run.dir=...``,
        ``hydra/launcher=...``) are not the job's config."""
        return [o for o in self.overrides
                if not o.lstrip("+~").startswith("hydra") or o.lstrip("+").split("=")[0] == SEARCHPATH]


def parse_command_line(argv: list[str]) -> CommandLine:
    """``argv`` read by Hydra's own argument parser (its flags and their short forms)."""
    from hydra._internal.utils import get_args_parser

    args, _ = get_args_parser().parse_known_args(argv)
    config_dir = os.path.abspath(args.config_dir) if args.config_dir is not None else None
    return CommandLine(overrides=[o for o in args.overrides if "=" in o], config_dir=config_dir,
                       config_name=args.config_name or "config", config_path=args.config_path)


@contextmanager
def hydra_initialized(config_dir: str, command_line: CommandLine, job_name: str = "app") -> Iterator[None]:
    """``hydra.initialize_config_dir(config_dir)``, with ``command_line.config_dir`` on the search path as the
    app would have it; the global Hydra state restored after (as ``initialize_config_dir`` restores it)."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import SearchPathException
    from hydra.initialize import get_gh_backup, restore_gh_from_backup
    from hydra.version import setbase

    setbase("1.3")
    search_path = create_config_search_path(search_path_dir=config_dir)
    if command_line.config_dir is not None:
        if not os.path.isdir(command_line.config_dir):  # Hydra's words
            raise SearchPathException(f"Additional config directory '{command_line.config_dir}' not found")
        search_path.prepend(provider="command-line", path=f"file://{command_line.config_dir}",
                            anchor=SearchPathQuery(provider="schema"))
    backup = get_gh_backup()
    GlobalHydra.instance().clear()
    Hydra.create_main_hydra2(task_name=job_name, config_search_path=search_path)
    try:
        yield
    finally:
        restore_gh_from_backup(backup)
