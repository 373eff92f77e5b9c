"""The advised candidate's model on the race's parent run: a race's children keep their metrics
and checkpoints but log no MLflow model (the sweeper sets ``tracking.log_model=false``), so the
one model the answer needs is rebuilt here from a child's checkpoint and logged once.

Which child: the advised candidate's seed with the best objective among the seeds the race ran.
Its config is composed as the launcher composed it; the runner builds its parts
(:func:`runner.build.build_parts`), loads the checkpoint's training state and logs the model
with the runner's own model logging (:meth:`runner.tracking.Tracker.log_model`), registered as
``tracking.register`` when that is set.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from omegaconf import DictConfig

from experiments.race.race import Race


def best_seed(race: Race) -> int:
    """The advised candidate's seed with the highest objective (the first on ties)."""
    values = race.values[race.advised]
    return max(values, key=lambda seed: values[seed])


def log_advised_model(
    race: Race,
    keys: Mapping[tuple[str, int], str],
    compose: Callable[[str, int], DictConfig],
    where: tuple[str, str],
) -> str:
    """Log the advised candidate's model on the parent run ``where`` = (uri, run id) from its
    best seed's FINISHED child (``keys``: (candidate, seed) -> config key; ``compose``: the job's
    config for (candidate, seed)); returns one console line saying where it went."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from runner.build import build_parts
    from runner.results import predictor
    from runner.tracking import Tracker
    from runner.tracking.runs import child_runs
    from runner.train.state import load_checkpoint, total_epochs

    uri, parent_id = where
    seed = best_seed(race)
    key = keys.get((race.advised, seed), "")
    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(parent_id)
    child = next(
        (
            run
            for run in child_runs(client, parent.info.experiment_id, parent_id)
            if run.info.status == "FINISHED" and run.data.tags.get("config_key") == key
        ),
        None,
    )
    if child is None:
        return f"  no FINISHED run of {race.advised} on seed {seed}: no model logged"
    cfg = compose(race.advised, seed)
    parts = build_parts(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(child.data.tags.get("checkpoint", ""))
        if not path.is_file():  # its folder is gone: the copy the run logged, if it logged one
            try:
                path = Path(
                    client.download_artifacts(child.info.run_id, "checkpoint/checkpoint.pt", tmp)
                )
            except MlflowException:
                return (
                    f"  {race.advised} on seed {seed} (run {child.info.run_id}) kept no "
                    "checkpoint (trainer.checkpoint_every=0): no model logged on the parent"
                )
        parts.state.load_state_dict(load_checkpoint(path)["train"])
    register = cfg.tracking.get("register")
    step = total_epochs(cfg.trainer)  # the checkpoint holds the run's last epoch
    tracker = Tracker(client, uri, parent)
    tracker.log_model(*predictor(parts), list(parts.data.class_names), register, step)
    client.set_tag(parent_id, "advice/model_from", child.info.run_id)
    registered = f", registered as {register}" if register else ""
    return (
        f"  the advised model ({race.advised}, seed {seed}, run {child.info.run_id}) is on the "
        f"parent run: runs:/{parent_id}/model{registered}"
    )
