"""Shared training prefixes: a sweep's DRS, DRW and cRT runs fork from the uniform-CE training
they share instead of repeating it, and every number they record is the one each run trains to
alone (real sweeps into real stores, sequential and on joblib's parallel workers)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from runner.build import build_parts
from runner.locks import beat, turn
from runner.sweeps.prefixes import FORKED_TAG, declared_prefix
from tests.conftest import compose_config
from tests.helpers.cli import run_cli

SWEEP = (
    "seed=0,1",  # seed by seed, as the race launches: a later seed's CE run saves what DRS wants
    "+method=ce,drs,drw,crt",
    "data=digits_lt",
    "trainer.epochs=5",
    "trainer.progress=false",
    "tracking.log_model=false",
    "tracking.plots=false",
)
# Histories compared step by step, besides every metric's last value.
HISTORIES = ("train/loss", "test/balanced_accuracy", "sampling/kl_to_target", "train/lr")


def _sweep(tmp_path: Path, uri: str, name: str, *extra: str) -> dict[tuple[str, str], object]:
    cache = tmp_path / f"cache-{name}"
    launched = any(e.startswith("hydra/launcher=") for e in extra)  # its jobs: other processes
    run_cli(
        *SWEEP,
        *extra,
        f"prefixes.cache_dir={cache}",
        cwd=tmp_path,
        uri=uri,
        multirun=True,
        fresh=launched,
    )
    assert not cache.exists() or not any(cache.iterdir()), "a finished sweep removes its snapshots"
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("samplerlab").experiment_id])
    found = {
        (run.data.tags["method"], run.data.params["seed"]): run
        for run in runs
        if "mlflow.parentRunId" in run.data.tags
    }
    assert len(found) == 8
    return found


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


@pytest.mark.slow  # three sweeps of 8 digits runs
def test_forked_runs_record_what_they_train_to_alone(tmp_path, migrated_store):
    import shutil

    stores = {}
    for name in ("alone", "shared", "parallel"):
        shutil.copy(migrated_store, tmp_path / f"{name}.db")
        stores[name] = f"sqlite:///{tmp_path / f'{name}.db'}"
    alone = _sweep(tmp_path, stores["alone"], "alone", "prefixes.share=false")
    shared = _sweep(tmp_path, stores["shared"], "shared")
    parallel = _sweep(
        tmp_path, stores["parallel"], "parallel", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"
    )
    trained = {k: int(r.data.metrics["cost/epochs_trained"]) for k, r in shared.items()}
    # Seed 0: CE trains 5 epochs; DRS trains 4 epochs for everyone, then its own; DRW and cRT
    # fork there (cRT: its 5th epoch and 10 classifier epochs). Seed 1: CE saves epoch 4 as it
    # passes it (DRS wanted it on seed 0), and DRS forks too.
    assert trained == {
        ("ce", "0"): 5,
        ("drs", "0"): 5,
        ("drw", "0"): 1,
        ("crt", "0"): 11,
        ("ce", "1"): 5,
        ("drs", "1"): 1,
        ("drw", "1"): 1,
        ("crt", "1"): 11,
    }
    assert sum(int(r.data.metrics["cost/epochs_trained"]) for r in alone.values()) == 60
    forked = {k: r.data.tags.get(FORKED_TAG) for k, r in shared.items()}
    assert forked[("drw", "0")] == forked[("crt", "1")] == "4" and forked[("ce", "1")] is None
    for name, runs, uri in (
        ("shared", shared, stores["shared"]),
        ("parallel", parallel, stores["parallel"]),
    ):
        for key, run in runs.items():
            expected = alone[key].data.metrics
            got = run.data.metrics
            different = {
                m: (got.get(m), v)
                for m, v in expected.items()
                if m != "cost/epochs_trained" and got.get(m) != v
            }
            assert not different, f"{name} {key}: {different}"
            assert set(got) == set(expected)
            for metric in HISTORIES:
                assert _history(MlflowClient(uri), run.info.run_id, metric) == _history(
                    MlflowClient(stores["alone"]), alone[key].info.run_id, metric
                ), f"{name} {key} {metric}"
    assert sum(int(r.data.metrics["cost/epochs_trained"]) for r in parallel.values()) < 60


@pytest.mark.unit
def test_what_each_recipe_shares_with_the_cross_entropy_run():
    common = ["data=digits_lt", "data.val_per_class=5", "trainer.epochs=10"]
    declared = {}
    for method in (
        "ce",
        "drs",
        "drw",
        "crt",
        "lws",
        "tau_norm",
        "posthoc_la",
        "class_balanced",
        "ldam_drw",
    ):
        cfg = compose_config([f"+method={method}", *common])
        declared[method] = declared_prefix(cfg, build_parts(cfg))
    assert {m: p.epochs if p else 0 for m, p in declared.items()} == {
        "ce": 10,
        "drs": 8,  # its switch: 80% of the epochs
        "drw": 8,  # the loss's weights from 80% on
        "crt": 9,  # stage one, but for its last epoch (which logs stage1/*)
        "lws": 9,
        "tau_norm": 9,  # but for its last epoch, whose classifier it rescales
        "posthoc_la": 9,  # but for its last epoch, whose logits it adjusts
        "class_balanced": 0,
        "ldam_drw": 0,
    }
    assert (
        len(
            {
                declared[m].family
                for m in ("ce", "drs", "drw", "crt", "lws", "tau_norm", "posthoc_la")
            }
        )
        == 1
    )
    other_seed = compose_config(["+method=drs", *common, "seed=3"])
    prefix = declared_prefix(other_seed, build_parts(other_seed))
    assert prefix is not None and prefix.family == declared["ce"].family and prefix.seed == 3
    longer = compose_config(["+method=drs", *common, "trainer.epochs=11"])
    assert declared_prefix(longer, build_parts(longer)).family != declared["ce"].family


@pytest.mark.unit
def test_a_job_waits_while_the_holder_progresses_and_not_after(tmp_path):
    lock, said = tmp_path / "lock", []
    holding, release = threading.Event(), threading.Event()

    def holder(beats: int) -> None:
        with turn(lock, 60, "prefixes.cache_dir", "x", said.append) as held:
            assert held
            holding.set()
            for _ in range(beats):
                time.sleep(0.3)
                beat(lock)
            release.wait(10)

    worker = threading.Thread(target=holder, args=(3,))
    worker.start()
    assert holding.wait(10)
    started = time.monotonic()
    with turn(lock, 0.5, "prefixes.cache_dir", "x", said.append) as held:
        waited = time.monotonic() - started
    assert not held and 0.9 < waited < 5  # three beats kept it waiting, then 0.5 s of none
    assert said[0] == "x: another job is computing it; waiting for it"
    assert said[1].startswith("x: the job computing it made no progress for ")
    ready = threading.Timer(0.3, lambda: (tmp_path / "done").touch())
    ready.start()
    with turn(lock, 60, "s", "x", said.append, ready=(tmp_path / "done").exists) as held:
        assert not held and (tmp_path / "done").exists()
    release.set()
    worker.join(10)
    with turn(lock, 60, "s", "x", said.append) as held:
        assert held  # the holder's end released it
