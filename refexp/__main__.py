"""``refexp``: the Hydra face. Compose the config, validate it, call ``run(cfg)``; nothing else."""

import sys

import hydra
from omegaconf import DictConfig

from refexp.config import register_configs

register_configs()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def _app(cfg: DictConfig) -> float | None:
    from refexp.run import run_from_hydra  # imported late: `refexp --help` stays fast

    return run_from_hydra(cfg)


def main() -> None:
    _app()


if __name__ == "__main__":
    sys.exit(main())
