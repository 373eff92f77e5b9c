"""Frozen backbones (``model.freeze=true``): features computed once into the bank and reused,
damaged or foreign shards computed again, jobs taking turns, the backbone never trained."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from runner.build import build, build_model, freeze
from runner.config import CONF
from runner.data import LongTailData
from runner.locks import turn
from runner.models import FeatureClassifier
from runner.tracking.datasets import digest_of
from runner.train.features import FrozenBackbone
from runner.train.feed import place
from tests.conftest import compose_config

pytestmark = pytest.mark.unit

CPU = torch.device("cpu")


SMALL_CNN = ("model=small_cnn", "model.width=8")  # 32 features, BatchNorm in the backbone
MLP = ("model=mlp", "model.hidden=[64]")  # 64 random ReLU features: a head learns digits on them


def frozen_config(cache: Path, *overrides: str, model: tuple[str, ...] = SMALL_CNN):
    return compose_config(
        [
            "data=digits_lt",
            *model,
            "model.freeze=true",
            "trainer.augment=false",
            f"features.cache_dir={cache}",
            *overrides,
        ]
    )


def digits(cfg) -> LongTailData:
    return place(build("data", cfg.data), CPU)


def backbone_model(cfg, data: LongTailData) -> nn.Module:
    torch.manual_seed(cfg.seed)
    return build_model(cfg.model, data.in_shape, data.num_classes)


class ForwardCount:
    """How many module forward passes run while it is entered (every module, every call)."""

    def __enter__(self) -> ForwardCount:
        self.calls = 0

        def count(*_: object) -> None:
            self.calls += 1

        self.handle = torch.nn.modules.module.register_module_forward_hook(count)
        return self

    def __exit__(self, *_: object) -> None:
        self.handle.remove()


def shards(cache: Path) -> list[Path]:
    """The shard files of every feature bank under ``cache``."""
    return sorted(cache.glob("*/shard-*.pt"))


def test_features_are_computed_once_then_reused_without_a_forward_pass(tmp_path, capsys):
    cfg = frozen_config(tmp_path)
    data = digits(cfg)
    with ForwardCount() as first:
        model, swapped, frozen = freeze(backbone_model(cfg, data), data, cfg, CPU)
    line = capsys.readouterr().out.strip()
    total = len(data.train_x) + len(data.test_x)
    assert line.startswith(f"features: computed {total} x 32 from SmallCNN in "), line
    assert first.calls > 0 and frozen is not None
    assert swapped.train_x.shape == (len(data.train_x), 32) and swapped.normalize is None
    assert isinstance(model, FeatureClassifier) and isinstance(model.features, nn.Identity)
    assert len(shards(tmp_path)) == 2  # one shard per split computed: train and test
    (bank,) = {p.parent for p in shards(tmp_path)}
    assert bank.name.startswith("SmallCNN-") and line.endswith(f"(of {total}; {bank})")

    with ForwardCount() as second:
        _, again, _ = freeze(backbone_model(cfg, data), data, cfg, CPU)
    line = capsys.readouterr().out.strip()
    assert line == f"features: reused {total} rows (of {total}; {bank})"
    assert second.calls == 0 and len(shards(tmp_path)) == 2
    assert torch.equal(again.train_x, swapped.train_x) and torch.equal(again.test_x, swapped.test_x)
    # The head on cached features predicts as the whole model on the images.
    logged = frozen.model_for(model).eval()
    images = data.test_x[:16].float()
    assert torch.allclose(logged(images), model(swapped.test_x[:16]), atol=1e-5)


def test_the_default_cache_is_the_users_cache_folder_not_the_source_tree(user_cache):
    """``features.cache_dir: null`` means :func:`runner.cache_dirs.folder` ("features")."""
    cfg = compose_config(
        ["data=digits_lt", *SMALL_CNN, "model.freeze=true", "trainer.augment=false"]
    )
    assert cfg.features.cache_dir is None
    data = digits(cfg)
    freeze(backbone_model(cfg, data), data, cfg, CPU)
    assert len(shards(user_cache / "features")) == 2  # train and test


def test_a_config_with_hydras_own_keys_unresolvable_outside_a_job_is_frozen_too(tmp_path):
    """A job's config composed outside a launched job (the race composes the advised
    candidate's again to log its model) holds ``hydra.sweep.subdir: ${hydra.job.num}``, which
    only a job resolves: the cache key reads the model node alone."""
    from hydra import compose, initialize_config_dir

    overrides = ["data=digits_lt", *SMALL_CNN, "model.freeze=true", "trainer.augment=false"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            "config", [*overrides, f"features.cache_dir={tmp_path}"], return_hydra_config=True
        )
    data = digits(cfg)
    freeze(backbone_model(cfg, data), data, cfg, CPU)
    assert len(shards(tmp_path)) == 2  # train and test: digits_lt has no val here


def test_another_backbone_or_other_weights_get_their_own_banks(tmp_path, capsys):
    cfg = frozen_config(tmp_path)
    data = digits(cfg)
    for other in ([], ["seed=1"], ["model.width=16"], ["model.head=cosine"]):
        variant = frozen_config(tmp_path, *other)  # the same, other weights, backbone, head
        freeze(backbone_model(variant, data), data, variant, CPU)
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[1] for line in lines] == ["computed", "computed", "computed", "reused"], (
        lines
    )
    assert len({p.parent for p in shards(tmp_path)}) == 3 and len(shards(tmp_path)) == 6


def test_a_truncated_shard_is_computed_again_with_one_line(tmp_path, capsys):
    cfg = frozen_config(tmp_path)
    data = digits(cfg)
    _, first, _ = freeze(backbone_model(cfg, data), data, cfg, CPU)
    train = shard_of(tmp_path, len(data.train_x))
    train.write_bytes(train.read_bytes()[:1000])
    capsys.readouterr()
    _, again, _ = freeze(backbone_model(cfg, data), data, cfg, CPU)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == (
        f"features: {train} is unreadable (RuntimeError); its rows are computed again"
    )
    assert lines[1].startswith(f"features: computed {len(data.train_x)} x 32 from SmallCNN")
    assert f"; reused {len(data.test_x)} rows" in lines[1] and len(lines) == 2
    assert torch.equal(again.train_x, first.train_x)
    assert torch.load(train, weights_only=True)["features"].shape == first.train_x.shape


def shard_of(cache: Path, rows: int) -> Path:
    """The one shard under ``cache`` holding ``rows`` rows."""
    (found,) = [
        p for p in shards(cache) if len(torch.load(p, weights_only=True)["features"]) == rows
    ]
    return found


def test_a_tampered_or_foreign_shard_is_computed_again_with_one_line(tmp_path, capsys):
    cfg = frozen_config(tmp_path)
    data = digits(cfg)
    _, first, _ = freeze(backbone_model(cfg, data), data, cfg, CPU)
    train, test = shard_of(tmp_path, len(data.train_x)), shard_of(tmp_path, len(data.test_x))
    entry = torch.load(train, weights_only=True)
    entry["features"] = entry["features"] + 1.0  # other values, the old checksum
    torch.save(entry, train)
    foreign = torch.load(test, weights_only=True)
    foreign["key"] = "0" * 64  # a whole shard of another backbone in this bank
    torch.save(foreign, test)
    capsys.readouterr()
    _, again, _ = freeze(backbone_model(cfg, data), data, cfg, CPU)
    lines = capsys.readouterr().out.strip().splitlines()
    problems = {
        train: "fails its checksum (corrupt)",
        test: "is not a shard of this backbone and format",
    }
    expected = [f"features: {p} {why}; its rows are computed again" for p, why in problems.items()]
    assert sorted(lines[:2]) == sorted(expected)
    assert lines[2].startswith("features: computed ") and len(lines) == 3
    assert torch.equal(again.train_x, first.train_x) and torch.equal(again.test_x, first.test_x)


def test_a_second_job_waits_for_the_first_and_reuses_its_features(tmp_path, capsys):
    """Two jobs of a sweep at once: the second waits on the bank's lock rather than computing."""
    cfg = frozen_config(tmp_path)
    data = digits(cfg)
    freeze(backbone_model(cfg, data), data, cfg, CPU)
    train = shard_of(tmp_path, len(data.train_x))
    saved = train.read_bytes()
    train.unlink()
    capsys.readouterr()
    holding, done = threading.Event(), []

    def first_job() -> None:  # holds the turn while "computing", then writes the shard
        with turn(train.parent / ".lock", 60, "features.cache_dir", "x", print):
            holding.set()
            time.sleep(1.0)
            train.write_bytes(saved)

    worker = threading.Thread(target=first_job)
    worker.start()
    assert holding.wait(10)
    with ForwardCount() as second:
        freeze(backbone_model(cfg, data), data, cfg, CPU)
        done.append(train.is_file())
    worker.join(10)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == f"features {train.parent.name}: another job is computing it; waiting for it"
    assert lines[1].startswith("features: reused ") and second.calls == 0 and done == [True]


def test_a_frozen_backbone_stays_in_eval_mode_without_gradients():
    backbone = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Dropout(0.5))
    model = FeatureClassifier(FrozenBackbone(backbone), nn.Linear(3, 2), 3).train()
    assert not backbone.training and model.training and model.classifier.training
    x = torch.randn(8, 4)
    model(x).sum().backward()
    assert all(p.grad is None for p in backbone.parameters())
    assert model.classifier.weight.grad is not None
    assert torch.equal(backbone[1].running_mean, torch.zeros(3))  # statistics unchanged


def trained_run(cfg, tracking_uri: str):
    """Train ``cfg`` as the runner does; the backbone as built before training, and the logged
    model with the run's results."""
    from mlflow.tracking import MlflowClient

    from runner.app import run
    from runner.build import build_parts
    from runner.tracking.flavor import mlflow_pytorch

    built = build_parts(cfg).state.model
    before = {k: v.clone() for k, v in built.state_dict().items()}
    results = run(cfg)
    (record,) = MlflowClient(tracking_uri).search_runs(
        [MlflowClient(tracking_uri).get_experiment_by_name("samplerlab").experiment_id]
    )
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    logged = mlflow_pytorch().load_model(f"runs:/{record.info.run_id}/model")
    return before, logged, results, record


TRAINING = ("trainer.epochs=3", "trainer.batch_size=64", "trainer.progress=false")


@pytest.mark.slow
def test_on_cached_features_the_head_alone_trains_and_the_logged_model_takes_images(
    tmp_path, tracking_uri, capsys
):
    from sklearn.metrics import balanced_accuracy_score

    cfg = frozen_config(
        tmp_path / "cache",
        *TRAINING,
        "tracking.plots=false",
        f"tracking.uri={tracking_uri}",
        model=MLP,
    )
    data = digits(cfg)
    backbone = freeze(backbone_model(cfg, data), data, cfg, CPU)[2]
    assert backbone is not None
    untrained = {k: v.clone() for k, v in backbone.backbone.state_dict().items()}
    head, logged, results, record = trained_run(cfg, tracking_uri)
    out = capsys.readouterr().out
    assert out.count("features: computed") == 1 and out.count("features: reused") == 2, out
    trained = logged.model
    assert untrained.keys() == trained.features.backbone.state_dict().keys()
    for name, tensor in trained.features.backbone.state_dict().items():
        assert torch.equal(tensor, untrained[name]), name  # BatchNorm statistics too
    assert not torch.equal(trained.classifier.weight, head["classifier.weight"])
    with torch.no_grad():
        predicted = logged(data.test_x).argmax(1).numpy()
    accuracy = balanced_accuracy_score(data.test_y.numpy(), predicted)
    assert accuracy == pytest.approx(results["final/balanced_accuracy"], abs=1e-12)
    # Chance is 0.1, with a spread of about 0.015 over 500 balanced test digits: the head learned.
    assert accuracy > 0.3
    # The run's MLflow datasets describe the images it was given, not the features made of them.
    digests = {i.dataset.name: i.dataset.digest for i in record.inputs.dataset_inputs}
    assert digests["digits_lt-test"] == digest_of(data.test_x, data.test_y)[:16]


@pytest.mark.slow
def test_with_augmentation_the_frozen_backbone_runs_every_batch_and_stays_unchanged(
    tmp_path, tracking_uri, capsys
):
    cfg = frozen_config(
        tmp_path / "cache",
        *TRAINING,
        "trainer.augment=true",
        "tracking.plots=false",
        f"tracking.uri={tracking_uri}",
    )
    before, logged, _, _ = trained_run(cfg, tracking_uri)
    line = (
        "features: not cached: augmentation is on (trainer.augment=true), so the frozen backbone "
        "computes them for every batch; trainer.augment=false computes them once"
    )
    assert capsys.readouterr().out.count(line + "\n") == 2  # building the parts here, and the run
    assert not (tmp_path / "cache").exists()
    after = logged.model.state_dict()
    backbone = [k for k in before if k.startswith("features.")]
    assert backbone and all(torch.equal(after[k], before[k]) for k in backbone)
    assert not torch.equal(after["classifier.weight"], before["classifier.weight"])
