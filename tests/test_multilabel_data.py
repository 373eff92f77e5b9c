"""Multi-label data sources and their split: iterative stratification (Sechidis et al. 2011), the
synthetic long tail with co-occurring labels, tensor files with a label matrix, and an image
folder with a labels CSV; every user error in one line naming the parameter and the fix."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from runner.data import synthetic_lt, tensor_file
from runner.data.multilabel import (
    MultiLabelData,
    class_counts,
    is_multilabel_source,
    synthetic_multilabel,
)
from runner.data.multilabel_files import multilabel_image_folder, multilabel_tensor_file
from runner.data.stratify import iterative_split

pytestmark = pytest.mark.unit


def long_tail_matrix(n: int = 2000, classes: int = 8, seed: int = 0) -> np.ndarray:
    rng = np.random.RandomState(seed)
    rates = 0.4 * (0.02 / 0.4) ** (np.arange(classes) / (classes - 1))
    y = rng.rand(n, classes) < rates
    y[:, 0] |= y[:, classes // 2 :].any(1) & (rng.rand(n) < 0.7)
    return y


def test_iterative_split_is_a_seeded_partition() -> None:
    y = long_tail_matrix()
    rest, held = iterative_split(y, 0.25, seed=3)
    assert np.intersect1d(rest, held).size == 0
    assert np.array_equal(np.sort(np.concatenate([rest, held])), np.arange(len(y)))
    again = iterative_split(y, 0.25, seed=3)
    assert np.array_equal(again[1], held)
    assert not np.array_equal(iterative_split(y, 0.25, seed=4)[1], held)


def test_the_rarest_class_is_split_exactly_and_every_class_closer_than_at_random() -> None:
    y = long_tail_matrix()
    fraction = 0.25
    _, held = iterative_split(y, fraction, seed=0)
    positives = y.sum(0)
    held_positives = y[held].sum(0)
    rarest = int(np.argmin(np.where(positives > 0, positives, np.inf)))
    exact = fraction * positives[rarest]
    assert np.floor(exact) <= held_positives[rarest] <= np.ceil(exact)
    # Sechidis et al.'s label distribution measure: the mean over classes of how far a part's
    # share of the class's positives is from its share of the samples. A random split of the
    # same size, on the same fixed seed, is the baseline the paper compares with.
    random_held = np.random.RandomState(0).permutation(len(y))[: held.size]

    def deviation(part: np.ndarray) -> float:
        return float(np.mean(np.abs(y[part].sum(0) / positives - part.size / len(y))))

    assert deviation(held) < 0.5 * deviation(random_held)
    assert abs(held.size - fraction * len(y)) <= 0.01 * len(y)


def test_rows_without_labels_fill_the_part_that_wants_samples() -> None:
    y = np.zeros((10, 2), dtype=bool)
    y[:2, 0] = True
    y[2:4, 1] = True
    rest, held = iterative_split(y, 0.5, seed=0)
    assert held.size == rest.size == 5
    assert y[held].sum(0).tolist() == [1, 1]


def test_the_multilabel_sources_are_known_by_their_parameters() -> None:
    assert all(is_multilabel_source(s) for s in (synthetic_multilabel, multilabel_tensor_file))
    assert is_multilabel_source(multilabel_image_folder)
    assert not any(is_multilabel_source(s) for s in (tensor_file, synthetic_lt, print))


def test_synthetic_multilabel_is_a_seeded_long_tail_with_co_occurrence() -> None:
    data = synthetic_multilabel(train_size=3000, val_fraction=0.2)
    assert isinstance(data, MultiLabelData)
    assert data.val_y is not None and data.val_x is not None
    assert data.train_y.dtype == torch.bool and data.train_y.shape[1] == 10
    assert bool(data.train_y.any(1).all())  # every sample carries a label
    counts = data.train_counts
    assert counts.tolist() == data.train_y.sum(0).tolist() and data.train_size == len(data.train_y)
    assert counts[0] > 10 * counts[-1]
    assert class_counts(data.val_y, 10).tolist() == data.val_y.sum(0).tolist()
    assert class_counts(torch.tensor([0, 2, 2]), 4).tolist() == [1, 0, 2, 0]
    y = data.train_y
    tail = y[:, 5:].any(1)
    assert y[tail, 0].float().mean() > y[~tail, 0].float().mean() + 0.2
    again = synthetic_multilabel(train_size=3000, val_fraction=0.2)
    assert torch.equal(again.train_x, data.train_x) and torch.equal(again.val_y, data.val_y)
    other = synthetic_multilabel(train_size=3000, val_fraction=0.2, data_seed=1)
    assert not torch.equal(other.train_y, data.train_y)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"val_fraction": 1.5}, "data.val_fraction must lie in [0, 1)"),
        ({"imbalance_factor": 0.5}, "data.imbalance_factor must be >= 1"),
        ({"profile": "linear"}, "data.profile='linear' is unknown"),
        ({"co_occurrence": 2.0}, "data.co_occurrence must lie in [0.0, 1.0]"),
    ],
)
def test_synthetic_multilabel_refuses_bad_values(setting: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        synthetic_multilabel(**setting)


def save_npz(path: Path, **arrays: np.ndarray) -> str:
    np.savez(path, **arrays)
    return str(path)


def test_a_tensor_file_with_a_label_matrix_splits_by_iterative_stratification(
    tmp_path: Path,
) -> None:
    y = long_tail_matrix(600, 6)
    x = np.random.RandomState(0).randn(600, 5).astype(np.float32)
    path = save_npz(tmp_path / "tags.npz", x=x, y=y.astype(np.int64), class_names=list("abcdef"))
    data = multilabel_tensor_file(path=path, test_fraction=0.25, val_fraction=0.1)
    assert data.class_names == list("abcdef")
    assert len(data.test_y) + len(data.train_y) + len(data.val_y) == 600
    _, held = iterative_split(y, 0.25, seed=0 + 104729)
    assert torch.equal(data.test_y, torch.from_numpy(y[held]))
    test_x = data.test_x.__getitems__(np.arange(len(data.test_x)))
    assert torch.equal(test_x, torch.from_numpy(x[held]))


@pytest.mark.parametrize(
    ("y", "message"),
    [
        (np.array([[0, 2]] * 10), r"y\[0, 1\] is 2; entries must be 0 or 1"),
        (np.ones((9, 2)), "y has 9 rows for 10 samples"),
        (np.ones(10), r"y must be an \(N, C\) 0/1 matrix.*data=tensor_file"),
    ],
)
def test_a_bad_label_matrix_is_named_with_its_fix(
    tmp_path: Path, y: np.ndarray, message: str
) -> None:
    path = save_npz(tmp_path / "bad.npz", x=np.zeros((10, 3), np.float32), y=y)
    with pytest.raises(ValueError, match=message):
        multilabel_tensor_file(path=path)


def test_tensor_file_points_a_label_matrix_to_the_multilabel_source(tmp_path: Path) -> None:
    path = save_npz(tmp_path / "m.npz", x=np.zeros((10, 3), np.float32), y=np.ones((10, 2)))
    with pytest.raises(ValueError, match="data=multilabel_file"):
        tensor_file(path=path)


def test_a_class_without_test_samples_is_refused(tmp_path: Path) -> None:
    y = np.zeros((20, 2), dtype=np.int64)
    y[:, 0] = 1
    y[:10, 1] = 1
    path = save_npz(
        tmp_path / "t.npz",
        x=np.zeros((20, 3), np.float32),
        y=y,
        x_test=np.zeros((4, 3), np.float32),
        y_test=np.array([[1, 0]] * 4),
    )
    with pytest.raises(
        ValueError, match=r"the test split has no sample of class\(es\) \['class_1'\]"
    ):
        multilabel_tensor_file(path=path)


def image_folder(tmp_path: Path, rows: int = 24) -> tuple[Path, np.ndarray]:
    """``rows`` 8x8 RGB images and a labels CSV naming their classes."""
    i = np.arange(rows)
    y = np.stack([i % 2 == 0, i % 3 == 0, i % 5 == 1], axis=1)
    y[~y.any(1), 0] = True
    names = ["cat", "dog", "sofa"]
    (tmp_path / "images").mkdir()
    lines = ["file,labels"]
    rng = np.random.RandomState(0)
    for i, row in enumerate(y):
        pixels = rng.randint(0, 256, (8, 8, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(tmp_path / "images" / f"{i}.png")
        lines.append(
            f"images/{i}.png,{' '.join(n for n, on in zip(names, row, strict=True) if on)}"
        )
    (tmp_path / "labels.csv").write_text("\n".join(lines) + "\n")
    return tmp_path, y


def test_an_image_folder_with_a_labels_csv(tmp_path: Path) -> None:
    root, y = image_folder(tmp_path)
    data = multilabel_image_folder(root=str(root), test_fraction=0.25)
    assert data.class_names == ["cat", "dog", "sofa"]
    assert data.train_x.shape[1:] == (3, 8, 8) and data.normalize is not None
    assert len(data.train_y) + len(data.test_y) == len(y)
    assert int(data.train_y.sum() + data.test_y.sum()) == int(y.sum())
    first = data.train_x[0]
    assert first.dtype == torch.uint8


def test_an_image_folder_with_one_column_per_class(tmp_path: Path) -> None:
    root, y = image_folder(tmp_path)
    lines = ["file,cat,dog,sofa"] + [
        f"images/{i}.png," + ",".join(str(int(v)) for v in row) for i, row in enumerate(y)
    ]
    (root / "onehot.csv").write_text("\n".join(lines) + "\n")
    data = multilabel_image_folder(
        root=str(root), labels_csv="onehot.csv", labels_column=None, test_fraction=0.25
    )
    assert data.class_names == ["cat", "dog", "sofa"]
    assert int(data.train_y.sum() + data.test_y.sum()) == int(y.sum())


@pytest.mark.parametrize(
    ("csv", "settings", "message"),
    [
        ("name,labels\nimages/0.png,cat\n", {}, r"no column\(s\) \['file'\]"),
        ("file,labels\nimages/missing.png,cat\n", {}, "missing.png it names does not exist"),
        (
            "file,cat,dog\nimages/0.png,1,yes\n",
            {"labels_column": None},
            "row 2, column 'dog' holds 'yes'",
        ),
    ],
)
def test_a_bad_labels_csv_is_named_with_its_fix(
    tmp_path: Path, csv: str, settings: dict[str, object], message: str
) -> None:
    root, _ = image_folder(tmp_path, rows=4)
    (root / "bad.csv").write_text(csv)
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        multilabel_image_folder(root=str(root), labels_csv="bad.csv", **settings)
