"""``refexp``: the Hydra face. Compose the config, validate it, call ``run(cfg)`` (or plan a ``dry_run``)."""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from refexp.config import register_configs

register_configs()

# An absolute path: as a console script Hydra would otherwise look for a `conf` *module*.
CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def _app(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig

    from refexp.config import ConfigError, to_object
    from refexp.record.cache_dirs import CorruptCacheEntry

    try:
        # The one place a dry run is dispatched, a sweep's jobs included: the memory plan from meta-device
        # models, no data, no accelerator, no run dir (refexp/cli/dry_run.py).
        if cfg.get("dry_run"):
            from refexp.cli.dry_run import dry_run

            dry_run(cfg)
            return None
        if HydraConfig.get().mode.name == "MULTIRUN":  # a failing job is recorded and the sweep goes on (run.py)
            from refexp.run import run_from_hydra

            return run_from_hydra(cfg)
        to_object(cfg)  # every schema and cross-field check, before torch is imported
        from refexp.run import run_from_hydra  # imported late: `refexp --help` and config errors stay fast

        return run_from_hydra(cfg)
    except (ConfigError, CorruptCacheEntry) as e:  # bad input is the user's to fix: one line, no traceback (exit 2)
        print(f"refexp: error: {e}", file=sys.stderr)
        sys.exit(2)
    except Exception as e:
        from refexp.record.disk_full import describe_error, disk_full

        where = cfg.get("run_dir")  # filled in by run_from_hydra
        if not disk_full(e, where):
            raise
        # a full disk is the machine's, not a bug: one line (status.json says the same), exit 1 like a failed run
        print(f"refexp: error: {describe_error(e, where)}; free space, then rerun the same run dir to resume",
              file=sys.stderr)
        sys.exit(1)


def main() -> None:
    from refexp.cli.errors import precheck

    precheck(sys.argv[1:], CONF_DIR)  # a bad command line: one line, exit 2, before torch is imported
    _app()
    from refexp.cli.sweep import NOT_COMPLETED

    if NOT_COMPLETED:  # a -m sweep: every job ran, the callbacks were called; now say that some failed
        sys.exit(f"[refexp] {len(NOT_COMPLETED)} job(s) of the sweep did not complete: {', '.join(NOT_COMPLETED)}")


if __name__ == "__main__":
    sys.exit(main())
