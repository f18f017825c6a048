"""``refexp``: the Hydra face. Compose the config, validate it, call ``run(cfg)``; nothing else."""

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
    from refexp.run import run_from_hydra  # imported late: `refexp --help` stays fast

    return run_from_hydra(cfg)


def main() -> None:
    _app()


if __name__ == "__main__":
    sys.exit(main())
