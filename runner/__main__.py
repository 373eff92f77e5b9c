"""``python -m runner [group=choice ...] [key=value ...]`` (add ``-m`` to sweep).

Errors follow :mod:`runner.errors`: a user error prints one or two lines and exits 2, a bug
prints its traceback. Hydra's own error printing is switched off so that this module alone
decides what the user sees.
"""

from __future__ import annotations

import logging
import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from runner import quick_exit
from runner.config import register
from runner.errors import UserError
from runner.explain import exit_with, explain, is_user_error
from runner.extras import check_launcher
from runner.signals import Interrupted, stop_on_signals

register()
log = logging.getLogger("runner")


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def app(cfg: DictConfig) -> float:
    # Imported here, so that --help and --cfg load neither torch nor MLflow.
    from runner.checks import check_targets

    try:
        check_targets(cfg)  # config errors answer before the heavier imports below
        from runner.app import run
        from runner.distributed import process_group
        from runner.results import objective

        with process_group(cfg.trainer.device):  # under torchrun; nothing in one process
            return objective(cfg, run(cfg))
    except UserError as error:
        if HydraConfig.get().mode == RunMode.RUN and not _verbose():
            exit_with(error)  # a single run stops here; a sweep's other jobs go on
        log.error("samplerlab: %s", explain(error))
        raise


def _verbose() -> bool:
    return os.environ.get("SAMPLERLAB_TRACEBACK") == "1"


def main() -> None:
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        os.environ["SAMPLERLAB_TRACEBACK"] = "1"  # the user asked for tracebacks
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra re-raises; we report below
    # MLflow draws a progress bar for every artifact it downloads (a resumed run's config):
    # noise on stderr, where an error's one or two lines must stand alone.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    try:
        check_launcher(sys.argv[1:])  # a missing plugin: its extra, before Hydra starts
        with stop_on_signals():
            app()
    except BaseException as error:
        from runner.sweeps.callback import end_open_sweeps

        end_open_sweeps(error)  # a sweep's parent run never stays RUNNING
        if isinstance(error, Interrupted):
            sys.exit(error.exit_code)
        if _verbose() or not is_user_error(error):
            raise
        exit_with(error)


if __name__ == "__main__":
    # The program (python -m runner, samplerlab run): once the exit handlers registered from
    # here on have run, it ends without the interpreter's teardown (runner.quick_exit). Code
    # that calls main() ends as it would.
    with quick_exit.command():
        main()
