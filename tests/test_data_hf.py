"""data=hf: Hugging Face datasets saved to disk in the test (offline), with images or feature
vectors, single- or multi-label, read by the source and trained on by the runner."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image, List, Value
from mlflow.tracking import MlflowClient
from PIL import Image as PILImage

from runner.app import run
from runner.data.hf import hf_dataset
from runner.data.multilabel import MultiLabelData
from tests.conftest import compose_config

pytestmark = pytest.mark.unit

NAMES = ["cat", "dog", "sofa"]


def features_dataset(n: int, seed: int, multi_label: bool = False) -> Dataset:
    """Feature vectors whose mean says the class: ``n`` samples, class c in ``[4, 2, 1]``
    proportion (a long tail), or each class independently at those rates (multi-label)."""
    rng = np.random.RandomState(seed)
    means = rng.randn(3, 6) * 3
    if multi_label:
        y = rng.rand(n, 3) < np.array([0.6, 0.3, 0.15])
        y[~y.any(1), 0] = True
        x = y.astype(np.float64) @ means + rng.randn(n, 6)
        labels: list = [np.flatnonzero(row).tolist() for row in y]
        label = List(ClassLabel(names=NAMES))
    else:
        labels = rng.choice(3, n, p=[4 / 7, 2 / 7, 1 / 7]).tolist()
        x = means[labels] + rng.randn(n, 6)
        label = ClassLabel(names=NAMES)
    features = Features({"x": List(Value("float32")), "label": label})
    return Dataset.from_dict({"x": x.astype(np.float32).tolist(), "label": labels}, features)


def save(tmp_path: Path, multi_label: bool = False) -> str:
    train, test = features_dataset(420, 0, multi_label), features_dataset(150, 1, multi_label)
    folder = tmp_path / "saved"
    DatasetDict(train=train, test=test).save_to_disk(str(folder))
    return str(folder)


def test_single_label_features_with_class_names(tmp_path: Path) -> None:
    data = hf_dataset(path=save(tmp_path), x_column="x", val_per_class=10)
    assert data.class_names == NAMES and data.in_shape == (6,)
    assert data.train_y.dim() == 1 and data.val_y is not None
    assert data.train_counts[0] > data.train_counts[2]  # the data's own long tail, kept
    assert len(data.test_y) == 150


def test_multi_label_lists_become_a_label_matrix(tmp_path: Path) -> None:
    data = hf_dataset(path=save(tmp_path, multi_label=True), x_column="x", val_fraction=0.2)
    assert isinstance(data, MultiLabelData) and data.class_names == NAMES
    assert data.train_y.shape[1] == 3 and data.train_y.dtype == torch.bool
    assert data.val_y is not None and len(data.val_y) + len(data.train_y) == 420
    with pytest.raises(ValueError, match="data.imbalance_factor=10: the label column holds"):
        hf_dataset(path=save(tmp_path / "b", multi_label=True), x_column="x", imbalance_factor=10)


def test_images_are_decoded_when_read_and_a_single_split_is_held_out(tmp_path: Path) -> None:
    rng = np.random.RandomState(0)
    images = [PILImage.fromarray(rng.randint(0, 256, (8, 8, 3), dtype=np.uint8)) for _ in range(40)]
    labels = [i % 2 for i in range(40)]
    features = Features({"image": Image(), "label": ClassLabel(names=["a", "b"])})
    folder = tmp_path / "images"
    Dataset.from_dict({"image": images, "label": labels}, features).save_to_disk(str(folder))
    data = hf_dataset(path=str(folder), test_split=None, test_fraction=0.25)
    assert data.train_x.decodes and data.in_shape == (3, 8, 8)
    assert data.normalize is not None and len(data.test_y) == 10
    first = data.train_x[0]
    assert first.dtype == torch.uint8 and first.shape == (3, 8, 8)


@pytest.mark.parametrize(
    ("settings", "error", "message"),
    [
        ({"path": "/no/such/folder"}, FileNotFoundError, "no such folder"),
        ({"x_column": "pixels"}, ValueError, r"data.x_column='pixels': .* has the columns"),
        ({"x_column": "x", "label_column": "tag"}, ValueError, "data.label_column='tag'"),
        ({"x_column": "x", "split": "training"}, ValueError, r"data.split='training': .* splits"),
    ],
)
def test_bad_settings_are_named_with_their_fix(
    tmp_path: Path, settings: dict[str, object], error: type[Exception], message: str
) -> None:
    path = save(tmp_path)
    with pytest.raises(error, match=message):
        hf_dataset(**{"path": path, **settings})


def test_the_runner_trains_on_a_dataset_saved_to_disk(tmp_path: Path, tracking_uri: str) -> None:
    path = save(tmp_path, multi_label=True)
    cfg = compose_config(
        [
            "data=hf",
            f"data.path={path}",
            "data.x_column=x",
            "data.val_fraction=0.2",
            "sampler=multilabel/class_aware",
            "loss=multilabel/bce",
            "trainer.epochs=2",
            "trainer.progress=false",
            "tracking.log_model=false",
            f"tracking.uri={tracking_uri}",
        ]
    )
    results = run(cfg)
    client = MlflowClient(tracking_uri)
    (found,) = client.search_runs([client.get_experiment_by_name("samplerlab").experiment_id])
    assert found.info.status == "FINISHED" and math.isfinite(results["val/mAP"])
    assert {f"test/ap/{name}" for name in NAMES} <= set(found.data.metrics)
