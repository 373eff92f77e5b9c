"""``python -m runner [group=choice ...] [key=value ...]`` (add ``-m`` to sweep)."""

import hydra
from omegaconf import DictConfig

from runner.config import register

register()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float:
    from runner.app import run  # imported here so that --help and --cfg stay fast

    return run(cfg)["final/balanced_accuracy"]


if __name__ == "__main__":
    main()
