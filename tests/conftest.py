"""Shared fixtures: a real MLflow sqlite store per test (copied from one migrated template), real
Hydra composition of the project's config tree, and a cache folder of each test's own."""

from __future__ import annotations

import os
import shutil
import tomllib
from pathlib import Path

# Two test processes share two cores: one compute thread each, in them and in every process they
# start (torch's default of one thread per core oversubscribes the cores, and spinning OpenMP
# threads made a 5 s training test take minutes). Tests that vary the thread count set it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch
from hydra import compose, initialize_config_dir
from hypothesis import settings
from omegaconf import DictConfig

from runner.cache_dirs import ENV
from runner.config import CONF, register
from tests.helpers.schedule import LONGEST_FIRST
from tests.helpers.schedule import pytest_configure as pytest_configure
from tests.helpers.schedule import pytest_xdist_make_scheduler as pytest_xdist_make_scheduler

ROOT = Path(__file__).resolve().parents[1]


def registered_markers() -> tuple[str, ...]:
    """The names of the markers pyproject.toml registers (``"name: what it means"`` lines)."""
    with open(ROOT / "pyproject.toml", "rb") as file:
        lines = tomllib.load(file)["tool"]["pytest"]["ini_options"]["markers"]
    return tuple(line.split(":", 1)[0].strip() for line in lines)


KINDS = registered_markers()
register()
torch.set_num_threads(1)
# Property tests explore the same examples on every run: CI stays reproducible.
settings.register_profile("samplerlab", derandomize=True, database=None)
settings.load_profile("samplerlab")


@pytest.fixture(autouse=True)
def user_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's caches (``SAMPLERLAB_CACHE``, read at call time by :mod:`runner.cache_dirs`,
    and passed on to the CLI processes a test starts) in a folder of its own: never the user's
    ~/.cache, never shared with another test."""
    folder = tmp_path_factory.mktemp("samplerlab-cache")
    monkeypatch.setenv(ENV, str(folder))
    return folder


@pytest.fixture(autouse=True)
def nothing_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts with the process's memories of files, refits and row digests empty
    (:func:`runner.files.while_unchanged`, :func:`runner.train.refit.choose_refit`,
    :func:`runner.train.features.feed_digests`): a value one test left behind never answers
    another's call."""
    from collections import OrderedDict

    from runner import files
    from runner.train import features, refit

    monkeypatch.setattr(files, "_remembered", {})
    monkeypatch.setattr(refit, "_refits", OrderedDict())
    monkeypatch.setattr(features, "_FED", {})


@pytest.fixture(scope="session")
def migrated_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sqlite store with MLflow's migrations applied once (~2.6 s); copies open in 0.1 s."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("store") / "template.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def tracking_uri(migrated_store: Path, tmp_path: Path) -> str:
    db = tmp_path / "mlflow.db"
    shutil.copy(migrated_store, db)
    return f"sqlite:///{db}"


def compose_config(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test is of a kind: the marker closest to it (a test's own over its module's).
    The longest files first (:data:`LONGEST_FIRST`), the others as collected."""
    unmarked = [
        item.nodeid for item in items if not any(m.name in KINDS for m in item.iter_markers())
    ]
    if unmarked:
        raise pytest.UsageError(f"tests without a kind marker {KINDS}: {unmarked[:5]}")
    rank = {name: place for place, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: files stay whole
