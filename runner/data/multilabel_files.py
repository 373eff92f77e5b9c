"""The user's own multi-label data: tensors with an (N, C) 0/1 label matrix in a file
(``data=multilabel_file``) and an image folder with a labels CSV (``data=multilabel_folder``).
Without a test set of their own, ``test_fraction`` of the samples is held out by iterative
stratification (:mod:`runner.data.stratify`), seeded by ``data_seed``."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

from runner.data.multilabel import (
    TEST_SEED,
    MultiLabelCut,
    MultiLabelData,
    label_matrix,
    multilabel_source,
    split_fraction,
)
from runner.data.samples import ReadImage, Samples, channel_stats, check_finite, is_image
from runner.data.types import Augment, Feeding
from runner.data.yours import check_sample, features_tensor, named_classes, read_tensor_file


def held_out(
    labels: np.ndarray, test_fraction: float, data_seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """(rest, test) indices: ``test_fraction`` held out by iterative stratification."""
    return split_fraction(labels, test_fraction, data_seed + TEST_SEED, "data.test_fraction")


def finish_multilabel(
    name: str,
    train: tuple[Samples, np.ndarray],
    test: tuple[Samples, np.ndarray],
    class_names: list[str],
    augment: Augment,
    cut: MultiLabelCut,
    feeding: Feeding,
    where: str,
) -> MultiLabelData:
    """Images standardised with the training pool's per-channel statistics (augmented; other
    samples are not), then the validation split and the checks."""
    if tuple(test[0].sample.shape) != tuple(train[0].sample.shape):
        raise ValueError(
            f"{where}: test samples are {tuple(test[0].sample.shape)}, training samples "
            f"{tuple(train[0].sample.shape)}; they must have one shape (data.image_size=<pixels> "
            f"resizes images)"
        )
    image = is_image(train[0].sample)
    return cut.apply(
        name=name,
        train=train,
        test=test,
        class_names=class_names,
        augment=augment if train[0].sample.dim() == 3 else None,
        normalize=channel_stats(train[0], cut.data_seed) if image else None,
        feeding=feeding,
    )


@multilabel_source()
def multilabel_tensor_file(
    path: str,
    test_fraction: float = 0.2,
    crop_padding: int = 0,
    flip: bool = False,
    *,
    cut: MultiLabelCut,
    feeding: Feeding,
) -> MultiLabelData:
    """An ``.npz`` or ``.pt`` file with ``x`` (N, ...) and ``y`` an (N, C) 0/1 matrix, optionally
    ``x_test``/``y_test`` and ``class_names`` (one per column). ``x`` is float features or uint8
    images (N, C, H, W) or (N, H, W), standardised per channel one batch at a time."""
    where = f"data.path={path!r}"
    arrays = read_tensor_file(path, where, "an (N, C) 0/1 label matrix")
    x = features_tensor(arrays["x"], "x", where)
    check_finite(x, "x", where, "training samples")
    y = label_matrix(arrays["y"], "y", where, len(x))
    if "x_test" in arrays:
        x_test = features_tensor(arrays["x_test"], "x_test", where)
        check_finite(x_test, "x_test", where, "test samples")
        y_test = label_matrix(arrays["y_test"], "y_test", where, len(x_test))
        if y_test.shape[1] != y.shape[1]:
            raise ValueError(
                f"{where}: y_test has {y_test.shape[1]} label columns, y {y.shape[1]}; they "
                f"must have the same classes"
            )
        train, test = (Samples(x), y), (Samples(x_test), y_test)
    else:
        rest, held = held_out(y, test_fraction, cut.data_seed)
        train, test = (Samples(x)[rest], y[rest]), (Samples(x)[held], y[held])
    names = named_classes(arrays.get("class_names"), y.shape[1], where)
    augment = Augment(crop_padding, flip)
    return finish_multilabel("multilabel_file", train, test, names, augment, cut, feeding, where)


class ImageFiles:
    """Image files read by index with PIL (an item :class:`ReadImage` decodes on demand)."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> Any:
        from PIL import Image

        with Image.open(self.paths[index]) as image:
            return image.convert("RGB")


def read_labels_csv(
    table: Path, root: Path, file_column: str, labels_column: str | None, separator: str
) -> tuple[list[Path], list[list[str]] | np.ndarray, list[str] | None]:
    """The image paths (relative to ``root``) and their labels: with ``labels_column`` one
    column of class names split at ``separator`` (no names yet: they are the union), without
    it every other column is a class holding 0 or 1 (the names are the headers)."""
    where = f"data.labels_csv={str(table)!r}"
    if not table.is_file():
        raise FileNotFoundError(f"{where}: no such file; give a CSV with a header row")
    with open(table, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    header = list(rows[0]) if rows else []
    needed = [file_column] + ([labels_column] if labels_column else [])
    absent = [c for c in needed if c not in header]
    if absent:
        raise ValueError(
            f"{where}: no column(s) {absent} (its header: {header}); set data.file_column and "
            f"data.labels_column to its columns (labels_column null: one 0/1 column per class)"
        )
    paths = [root / row[file_column] for row in rows]
    lost = next((p for p in paths if not p.is_file()), None)
    if lost is not None:
        raise FileNotFoundError(
            f"{where}: the image {lost} it names does not exist; fix the path (relative to "
            f"data.root) or drop the row"
        )
    if labels_column:
        lists = [[t for t in row[labels_column].split(separator) if t.strip()] for row in rows]
        return paths, [[t.strip() for t in names] for names in lists], None
    classes = [c for c in header if c != file_column]
    values = np.array([[row[c].strip() for c in classes] for row in rows])
    bad = ~np.isin(values, ("0", "1"))
    if bad.any():
        row, column = (int(v) for v in np.argwhere(bad)[0])
        raise ValueError(
            f"{where}: row {row + 2}, column {classes[column]!r} holds {str(values[row, column])!r}; "
            f"with data.labels_column=null every column but {file_column!r} holds 0 or 1"
        )
    return paths, values == "1", classes


def _as_matrix(labels: list[list[str]] | np.ndarray, classes: list[str]) -> np.ndarray:
    if isinstance(labels, np.ndarray):
        return labels
    column = {c: i for i, c in enumerate(classes)}
    matrix = np.zeros((len(labels), len(classes)), dtype=bool)
    for row, names in enumerate(labels):
        matrix[row, [column[n] for n in names]] = True
    return matrix


@multilabel_source()
def multilabel_image_folder(
    root: str,
    labels_csv: str = "labels.csv",
    test_csv: str | None = None,
    file_column: str = "file",
    labels_column: str | None = "labels",
    separator: str = " ",
    test_fraction: float = 0.2,
    image_size: int | None = None,
    crop_padding: int = 4,
    flip: bool = True,
    *,
    cut: MultiLabelCut,
    feeding: Feeding,
) -> MultiLabelData:
    """Images under ``root`` listed in a CSV (``labels_csv``, relative to ``root``): a
    ``file_column`` with each image's path relative to ``root``, and either a
    ``labels_column`` of class names separated by ``separator`` (classes: their sorted union)
    or, with ``labels_column`` null, one 0/1 column per class. ``test_csv`` lists the test
    images likewise; without it ``test_fraction`` is held out. Images are decoded when read,
    resized and centre-cropped to ``image_size`` when given (else they must share one size)."""
    base = Path(root).expanduser()
    if not base.is_dir():
        raise FileNotFoundError(f"data.root={root!r}: no such folder; point it at your images")
    if image_size is not None and image_size < 1:
        raise ValueError(f"data.image_size must be >= 1 pixels (or null), got {image_size}")
    train_paths, train_labels, classes = read_labels_csv(
        base / labels_csv, base, file_column, labels_column, separator
    )
    test_read = None
    if test_csv is not None:
        test_read = read_labels_csv(base / test_csv, base, file_column, labels_column, separator)
    if classes is None:  # names in a column: the union of both tables'
        named = [n for names in train_labels for n in names]
        named += [n for names in (test_read[1] if test_read else []) for n in names]
        classes = sorted(set(named))
    elif test_read is not None and test_read[2] != classes:
        raise ValueError(
            f"data.test_csv={test_csv!r}: its class columns {test_read[2]} differ from "
            f"data.labels_csv's {classes}; both need the same columns"
        )
    read = ReadImage(image_size)
    y = _as_matrix(train_labels, classes)
    samples = Samples(ImageFiles(train_paths), read=read)
    check_sample(samples, f"data.labels_csv={labels_csv!r}")
    if test_read is not None:
        test = (Samples(ImageFiles(test_read[0]), read=read), _as_matrix(test_read[1], classes))
        train = (samples, y)
    else:
        rest, held = held_out(y, test_fraction, cut.data_seed)
        train, test = (samples[rest], y[rest]), (samples[held], y[held])
    augment = Augment(crop_padding, flip)
    where = f"data.root={root!r}"
    return finish_multilabel(
        "multilabel_folder", train, test, classes, augment, cut, feeding, where
    )
