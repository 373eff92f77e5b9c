"""The Hydra callback that publishes a sweep's report onto its parent run when the sweep ends
(``hydra.callbacks.report`` in ``runner/conf/config.yaml``). It imports the report only then: Hydra
instantiates callbacks for single runs too."""

from __future__ import annotations

import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class PublishReport(Callback):
    """On ``on_multirun_end``, before :class:`runner.sweeps.callback.SweepCallback` ends the parent run
    (Hydra ends callbacks in reverse order), build the sweep's report and log it onto the parent.
    A report that cannot be built never fails the sweep: the console says how to rebuild it."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from runner.sweeps.callback import open_sweep

        sweep = open_sweep()
        if sweep is None:
            return
        uri, parent_run_id = sweep
        from experiments.report import publish

        try:
            print(publish(uri, parent_run_id), flush=True)
        except Exception as error:
            print(
                f"samplerlab: the sweep's report failed ({type(error).__name__}: {error}); "
                f"rebuild it with: python -m experiments.report --parent {parent_run_id}",
                file=sys.stderr,
                flush=True,
            )
