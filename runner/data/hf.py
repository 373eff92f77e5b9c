"""A Hugging Face dataset saved with ``save_to_disk`` (``data=hf``): one column of samples
(images, decoded when read, or feature vectors) and one of labels, by name; single-label (a
class id per sample) or multi-label (a list of class ids per sample: the source reads it as an
(N, C) 0/1 matrix, :mod:`runner.data.multilabel`).

Single-label data take the long-tail cut as every source does (``imbalance_factor`` null keeps
the data's own); multi-label data take their validation split by iterative stratification and
refuse the cut's other settings. Without a test split in the dataset, ``test_fraction`` is held
out (per class, or by iterative stratification), seeded by ``data_seed``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch

from runner.data.cut import LongTailCut, long_tail_source
from runner.data.multilabel import MultiLabelCut
from runner.data.multilabel_files import finish_multilabel, held_out
from runner.data.samples import ReadImage, Samples, check_finite
from runner.data.types import Augment, Feeding, LongTailData
from runner.data.yours import check_labels, check_present, check_sample, finish, stratified_split
from runner.extras import require

MULTILABEL_CUT_ONLY = {"imbalance_factor": None, "n_max": None, "val_per_class": 0}


class ColumnItems:
    """One column of a dataset, read by index (an image is decoded when its item is read)."""

    def __init__(self, dataset: Any, column: str) -> None:
        self.dataset, self.column = dataset, column

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index][self.column]


def _splits(path: str, split: str, test_split: str | None) -> tuple[Any, Any | None]:
    """The training split and the test split (None: hold one out) of the saved dataset."""
    require("datasets", "hf", "data=hf")
    from datasets import Dataset, DatasetDict, load_from_disk

    where = f"data.path={path!r}"
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(
            f"{where}: no such folder; point it at a dataset saved with "
            f"dataset.save_to_disk(path) (a Dataset or a DatasetDict)"
        )
    try:
        loaded = load_from_disk(str(folder))
    except (FileNotFoundError, ValueError) as error:
        raise ValueError(
            f"{where}: not a dataset saved with save_to_disk ({str(error).splitlines()[0]})"
        ) from None
    if isinstance(loaded, Dataset):
        if test_split is not None:
            raise ValueError(
                f"data.test_split={test_split!r}: {where} holds one split, not a DatasetDict; "
                f"set data.test_split=null to hold out data.test_fraction"
            )
        return loaded, None
    assert isinstance(loaded, DatasetDict)
    for key, name in (("split", split), ("test_split", test_split)):
        if name is not None and name not in loaded:
            raise ValueError(
                f"data.{key}={name!r}: {where} has the splits {sorted(loaded)}; choose one"
            )
    return loaded[split], loaded[test_split] if test_split is not None else None


def _label_names(feature: Any) -> list[str] | None:
    names = getattr(feature, "names", None)
    return list(names) if names else None


def _labels(dataset: Any, column: str, where: str) -> tuple[np.ndarray, list[str] | None, bool]:
    """The label column: 1-D class ids, or (lists of ids) an (N, C) bool matrix; the class
    names from a ``ClassLabel`` feature; whether it is multi-label."""
    if column not in dataset.features:
        raise ValueError(
            f"data.label_column={column!r}: {where} has the columns {list(dataset.features)}; "
            f"name its label column"
        )
    feature = dataset.features[column]
    inner = getattr(feature, "feature", None)
    values = dataset[column]
    if inner is None:  # one class id per sample
        return check_labels(values, column, where, len(dataset)), _label_names(feature), False
    names = _label_names(inner)
    rows = [list(v) for v in values]
    ids = [i for row in rows for i in row]
    if any(not isinstance(i, (int, np.integer)) or i < 0 for i in ids):
        raise ValueError(
            f"{where}: {column} holds lists with other values than class ids >= 0; give each "
            f"sample a list of class ids (a List(ClassLabel) feature)"
        )
    num_classes = len(names) if names else (max(ids) + 1 if ids else 0)
    matrix = np.zeros((len(rows), num_classes), dtype=bool)
    for r, row in enumerate(rows):
        matrix[r, row] = True
    return matrix, names, True


def _samples(dataset: Any, column: str, image_size: int | None, where: str) -> Samples:
    """The sample column: images (an ``Image`` feature) read on demand, else feature vectors
    read into one float tensor."""
    if column not in dataset.features:
        raise ValueError(
            f"data.x_column={column!r}: {where} has the columns {list(dataset.features)}; "
            f"name its image or feature column"
        )
    if type(dataset.features[column]).__name__ == "Image":
        samples = Samples(ColumnItems(dataset, column), read=ReadImage(image_size))
        check_sample(samples, f"data.x_column={column!r}")
        return samples
    try:
        x = torch.as_tensor(np.asarray(dataset.with_format("numpy")[:][column]))
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"data.x_column={column!r}: its values do not form one array ({error}); give "
            f"every sample a feature vector of one length, or images"
        ) from None
    if not x.is_floating_point() or x.dim() < 2:
        raise ValueError(
            f"data.x_column={column!r}: holds {x.dtype} of shape {tuple(x.shape)}; it must hold "
            f"float feature vectors (N, D) or images"
        )
    x = x.float()
    check_finite(x, column, where, "samples")
    return Samples(x)


@long_tail_source()
def hf_dataset(
    path: str,
    x_column: str = "image",
    label_column: str = "label",
    split: str = "train",
    test_split: str | None = "test",
    test_fraction: float = 0.2,
    image_size: int | None = None,
    crop_padding: int = 4,
    flip: bool = True,
    *,
    cut: LongTailCut,
    feeding: Feeding,
) -> LongTailData:
    """A dataset saved with ``save_to_disk`` at ``path``: ``split`` trains, ``test_split`` tests
    (null, or a dataset of one split: ``test_fraction`` is held out). ``x_column`` holds images
    or float feature vectors, ``label_column`` a class id (``ClassLabel`` or integers) or a list
    of class ids per sample (multi-label); class names come from ``ClassLabel`` features."""
    where = f"data.path={path!r}"
    if image_size is not None and image_size < 1:
        raise ValueError(f"data.image_size must be >= 1 pixels (or null), got {image_size}")
    train_set, test_set = _splits(path, split, test_split)
    y, names, multi_label = _labels(train_set, label_column, where)
    x = _samples(train_set, x_column, image_size, where)
    augment = Augment(crop_padding, flip)
    if test_set is not None:
        test_y, _, _ = _labels(test_set, label_column, f"{where} ({test_split})")
        test = (_samples(test_set, x_column, image_size, where), test_y)
        train = (x, y)
        if multi_label and test_y.shape[1] != y.shape[1]:
            raise ValueError(
                f"{where}: the test split's labels have {test_y.shape[1]} classes, the "
                f"training split's {y.shape[1]}; give both the same ClassLabel names"
            )
    elif multi_label:
        rest, held = held_out(y, test_fraction, cut.data_seed)
        train, test = (x[rest], y[rest]), (x[held], y[held])
    else:
        rest, held = stratified_split(y, test_fraction, cut.data_seed)
        train, test = (x[rest], y[rest]), (x[held], y[held])
    if multi_label:
        names = names or [f"class_{c}" for c in range(y.shape[1])]
        return finish_multilabel(
            "hf", train, test, names, augment, _multilabel_cut(cut), feeding, where
        )
    check_present(train[1], label_column, where)
    num_classes = int(max(train[1].max(), test[1].max())) + 1
    if names is not None and len(names) >= num_classes:
        num_classes = len(names)
    return finish(
        name="hf",
        train=train,
        test=test,
        class_names=names or [f"class_{c}" for c in range(num_classes)],
        augment=augment,
        cut=cut,
        feeding=feeding,
        where=where,
    )


def _multilabel_cut(cut: LongTailCut) -> MultiLabelCut:
    """Multi-label data take a validation fraction and a seed; the long-tail cut's other
    settings cannot apply (a tail sample keeps its head co-labels) and are refused."""
    for key, neutral in MULTILABEL_CUT_ONLY.items():
        value = getattr(cut, key)
        if value != neutral:
            raise ValueError(
                f"data.{key}={value}: the label column holds lists (multi-label data), which "
                f"have no long-tail cut; set data.{key}={'null' if neutral is None else neutral}"
                f" (data.val_fraction takes a validation split)"
            )
    fields = {f.name for f in dataclasses.fields(MultiLabelCut)}
    return MultiLabelCut(**{k: v for k, v in dataclasses.asdict(cut).items() if k in fields})
