"""The user's own data: tensors in a file (``data=tensor_file``) and any torchvision-style dataset
class (``data=torchvision``). Both keep their samples where they are (a file, possibly memory
mapped, or a dataset that decodes on demand) as :class:`Samples`: the splits and the long-tail cut
compose indices and copy nothing; :mod:`runner.feeding` decides whether they are read into memory
or through a ``DataLoader``.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from runner.data import Augment, Feeding, LongTailData, Normalize, _make_long_tailed

STATS_SAMPLES = 2048  # images the per-channel mean and std are estimated from
FINITE_CHECK_ROWS = 4096  # samples checked at a time: a memory-mapped file is read in pieces


class SampleError(ValueError):
    """A sample cannot be read or does not match the others; the message names the fix."""


class Samples(Dataset):
    """Rows ``indices`` of ``base``: a tensor (rows are samples; it may be memory-mapped), or a
    map-style dataset whose items ``read`` turns into tensors. ``samples[i]`` is one sample,
    ``samples[array]`` another :class:`Samples` over those rows, and ``__getitems__`` (which a
    ``DataLoader`` calls) one stacked batch."""

    def __init__(
        self,
        base: Any,
        indices: np.ndarray | None = None,
        read: Callable[[Any, int], torch.Tensor] | None = None,
    ) -> None:
        self.base, self.read = base, read
        self.indices = (
            np.arange(len(base), dtype=np.int64)
            if indices is None
            else np.asarray(indices, dtype=np.int64)
        )

    def __len__(self) -> int:
        return int(self.indices.size)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, (int, np.integer)):
            return self.__getitems__([int(key)])[0]
        return Samples(self.base, self.indices[key], self.read)

    def __getitems__(self, positions: Sequence[int]) -> torch.Tensor:
        rows = self.indices[np.asarray(positions, dtype=np.int64)]
        if self.read is None:  # a tensor: one gather
            return self.base.index_select(0, torch.from_numpy(rows))
        items = [self.read(self.base, int(r)) for r in rows]
        first = self.sample
        for row, item in zip(rows, items, strict=True):
            if item.shape != first.shape or item.dtype != first.dtype:
                raise SampleError(
                    f"data.dataset: sample {row} is {tuple(item.shape)} {item.dtype}, the first "
                    f"is {tuple(first.shape)} {first.dtype}; give every image one size with "
                    f"data.image_size=<pixels>"
                )
            if item.is_floating_point() and not bool(torch.isfinite(item).all()):
                raise SampleError(
                    f"data.dataset: sample {row} holds {_first_bad(item)} (not finite); every "
                    f"sample must be finite: fix the dataset's sample {row} or its transform"
                )
        return torch.stack(items)

    @cached_property
    def sample(self) -> torch.Tensor:
        """The first sample (of the base), as read: fixes the shape and dtype of every other."""
        if self.read is None:
            return self.base[0]
        return self.read(self.base, int(self.indices[0]) if self.indices.size else 0)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self), *self.sample.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.sample.dtype

    @property
    def decodes(self) -> bool:
        """Whether reading a sample runs code (decoding): then workers pay off."""
        return self.read is not None

    @property
    def nbytes(self) -> int:
        """Memory the samples take once read into one tensor."""
        return len(self) * self.sample.numel() * self.sample.element_size()

    def __getstate__(self) -> dict[str, Any]:  # the cached sample need not travel to workers
        state = dict(self.__dict__)
        state.pop("sample", None)
        return state


def _stratified_split(
    labels: np.ndarray, fraction: float, data_seed: int, parameter: str = "data.test_fraction"
) -> tuple[np.ndarray, np.ndarray]:
    """A seeded per-class split: ``max(1, round(fraction * n_c))`` of class c go to the test set."""
    if not 0 < fraction < 1:
        raise ValueError(f"{parameter} must lie in (0, 1) (e.g. 0.2), got {fraction}")
    rng = np.random.RandomState(data_seed + 104729)
    test = []
    for c in range(int(labels.max()) + 1):
        members = np.flatnonzero(labels == c)
        if members.size < 2:
            raise ValueError(
                f"{parameter}={fraction}: class {c} has {members.size} sample(s); a test split "
                f"needs at least 2 per class; provide x_test/y_test or drop the class"
            )
        take = min(members.size - 1, max(1, round(fraction * members.size)))
        test.append(rng.permutation(members)[:take])
    test_idx = np.sort(np.concatenate(test))
    return np.setdiff1d(np.arange(labels.size), test_idx), test_idx


def _check_labels(y: Any, name: str, where: str, length: int) -> np.ndarray:
    """1-D integer labels 0..C-1, one per sample."""
    array = y.numpy() if torch.is_tensor(y) else np.asarray(y)
    if array.ndim != 1 or not (
        np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.bool_)
    ):
        raise ValueError(
            f"{where}: {name} must be 1-D integer class indices 0..C-1, got dtype {array.dtype} "
            f"and shape {tuple(array.shape)}; convert it, e.g. y.astype('int64')"
        )
    if array.size != length:
        raise ValueError(
            f"{where}: {name} has {array.size} labels for {length} samples; they must match"
        )
    if array.size and array.min() < 0:
        raise ValueError(f"{where}: {name} has negative labels; use class indices 0..C-1")
    return array.astype(np.int64)


def _check_present(labels: np.ndarray, name: str, where: str) -> None:
    """Every class 0..max has samples (else sampling and per-class metrics have a hole)."""
    absent = np.flatnonzero(np.bincount(labels) == 0)
    if absent.size:
        raise ValueError(
            f"{where}: {name} has no samples of class(es) {absent[:10].tolist()}; labels must be "
            f"0..C-1 with every class present (relabel: np.unique(y, return_inverse=True)[1])"
        )


def _class_names(names: Any, num_classes: int, where: str) -> list[str]:
    if names is None:
        return [f"class_{c}" for c in range(num_classes)]
    names = [str(n) for n in (names.tolist() if hasattr(names, "tolist") else names)]
    if len(names) != num_classes:
        raise ValueError(
            f"{where}: class_names has {len(names)} names for {num_classes} classes "
            f"(labels 0..{num_classes - 1}); give one name per class or leave it out"
        )
    return names


def channel_stats(samples: Samples, data_seed: int) -> Normalize:
    """Per-channel mean and std of uint8 images in [0, 1], from up to ``STATS_SAMPLES`` of them
    chosen with the data seed (all of them when there are fewer)."""
    n = len(samples)
    rows = np.arange(n)
    if n > STATS_SAMPLES:
        rows = np.sort(np.random.RandomState(data_seed).choice(n, STATS_SAMPLES, replace=False))
    x = torch.cat(
        [samples.__getitems__(chunk) for chunk in np.array_split(rows, -(-rows.size // 256))]
    )
    x = x.double() / 255.0
    std = x.std(dim=(0, 2, 3)).clamp(min=1e-3)
    return x.mean(dim=(0, 2, 3)).tolist(), std.tolist()


def _is_image(sample: torch.Tensor) -> bool:
    return sample.dtype == torch.uint8 and sample.dim() == 3


def _finish(
    name: str,
    train: Samples,
    train_y: np.ndarray,
    test: Samples,
    test_y: np.ndarray,
    class_names: list[str],
    imbalance_factor: float | None,
    profile: str,
    data_seed: int,
    n_max: int | None,
    crop_padding: int,
    flip: bool,
    val_per_class: int,
    feeding: Feeding,
    where: str,
) -> LongTailData:
    """Shapes checked, images standardised with the training pool's statistics, then the
    splits and the cut (indices only)."""
    if tuple(test.sample.shape) != tuple(train.sample.shape):
        raise ValueError(
            f"{where}: test samples are {tuple(test.sample.shape)}, training samples "
            f"{tuple(train.sample.shape)}; they must have one shape"
        )
    normalize = channel_stats(train, data_seed) if _is_image(train.sample) else None
    augment = Augment(crop_padding, flip) if train.sample.dim() == 3 else None
    return _make_long_tailed(
        name,
        train,
        train_y,
        test,
        test_y,
        class_names,
        imbalance_factor,
        profile,
        data_seed,
        n_max,
        augment,
        val_per_class,
        normalize,
        feeding,
    )


# --- data=tensor_file ---------------------------------------------------------------------


def _load_tensor_file(path: Path, where: str) -> dict[str, Any]:
    """The file's arrays by key: an ``.npz`` read with numpy (no pickles), a ``.pt`` dict of
    tensors read memory-mapped where the format allows (torch.save's zip format)."""
    suffix = path.suffix.lower()
    if suffix == ".npz":
        if not zipfile.is_zipfile(path):
            raise ValueError(
                f"{where}: cannot read it as .npz (not a zip archive); save it with "
                f"numpy.savez(path, x=..., y=...)"
            )
        try:
            with np.load(path, allow_pickle=False) as file:
                return {k: file[k] for k in file.files}
        except (ValueError, OSError, zipfile.BadZipFile, EOFError) as error:
            raise ValueError(
                f"{where}: cannot read it as .npz ({error}); save it with "
                f"numpy.savez(path, x=..., y=...) (numbers and strings only)"
            ) from None
    if suffix in (".pt", ".pth"):
        try:
            try:
                loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as error:
                if "mmap" not in str(error):
                    raise
                loaded = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # torch raises many kinds for a bad file
            raise ValueError(
                f"{where}: cannot read it as a torch file ({type(error).__name__}: "
                f"{str(error).splitlines()[0] if str(error) else ''}); save a dict with "
                f"torch.save({{'x': ..., 'y': ...}}, path)"
            ) from None
        if not isinstance(loaded, dict):
            raise ValueError(
                f"{where}: holds a {type(loaded).__name__}, not a dict; save a dict with "
                f"torch.save({{'x': ..., 'y': ...}}, path)"
            )
        return loaded
    raise ValueError(f"{where}: unknown file type {suffix or '(none)'}; use a .npz or .pt file")


def _first_bad(x: torch.Tensor) -> float:
    """The first non-finite value of ``x`` (which has one)."""
    flat = x.reshape(-1)
    return float(flat[~torch.isfinite(flat)][0])


def check_finite(x: torch.Tensor, key: str, where: str, split: str) -> None:
    """Float samples must be finite: a NaN or inf input makes every loss after it non-finite,
    which would otherwise read as a learning rate that is too high. Names the first bad row."""
    if not x.is_floating_point():
        return  # integers (uint8 images) are finite
    for start in range(0, len(x), FINITE_CHECK_ROWS):
        chunk = x[start : start + FINITE_CHECK_ROWS].reshape(-1, max(1, x[0].numel()))
        finite = torch.isfinite(chunk).all(dim=1)
        if not bool(finite.all()):
            row = start + int((~finite).nonzero()[0])
            raise ValueError(
                f"{where}: {key}[{row}] ({split}) holds {_first_bad(x[row])}, not a finite "
                f"number; every sample must be finite: fix or drop row {row} of {key}"
            )


def _features(array: Any, key: str, where: str) -> torch.Tensor:
    x = torch.from_numpy(array) if isinstance(array, np.ndarray) else array
    if not torch.is_tensor(x) or x.dim() < 2:
        shape = tuple(getattr(x, "shape", ()))
        raise ValueError(
            f"{where}: {key} must be an array of samples (N, features) or images (N, C, H, W), "
            f"got {type(array).__name__} of shape {shape}"
        )
    if not (x.is_floating_point() or x.dtype == torch.uint8):
        raise ValueError(f"{where}: {key} has dtype {x.dtype}; use float features or uint8 images")
    if x.dtype == torch.uint8 and x.dim() == 3:  # (N, H, W) grey images
        x = x.unsqueeze(1)
    return x


def tensor_file(
    path: str,
    test_fraction: float = 0.2,
    imbalance_factor: float | None = None,
    profile: str = "exp",
    data_seed: int = 0,
    n_max: int | None = None,
    crop_padding: int = 0,
    flip: bool = False,
    val_per_class: int = 0,
    in_memory: bool | None = None,
    memory_budget_gb: float | None = None,
    num_workers: int | None = None,
) -> LongTailData:
    """An ``.npz`` or ``.pt`` file with ``x`` (N, ...) and ``y`` (N,) integer labels 0..C-1, and
    optionally ``x_test``/``y_test`` (else a stratified split of ``test_fraction`` per class,
    seeded by ``data_seed``) and ``class_names``. ``x`` is float features or uint8 images
    (N, C, H, W) or (N, H, W), which are standardised per channel one batch at a time.
    ``imbalance_factor`` None keeps the data's own imbalance."""
    file = Path(path).expanduser()
    where = f"data.path={path!r}"
    if not file.is_file():
        raise FileNotFoundError(
            f"{where}: no such file; point data.path at an .npz or .pt file with x and y"
        )
    arrays = _load_tensor_file(file, where)
    missing = [k for k in ("x", "y") if k not in arrays]
    if missing:
        raise ValueError(
            f"{where}: missing key(s) {missing} (found {sorted(arrays)}); save x (samples) "
            f"and y (integer labels), optionally x_test, y_test and class_names"
        )
    if ("x_test" in arrays) != ("y_test" in arrays):
        raise ValueError(f"{where}: has one of x_test and y_test; give both or neither")
    x = _features(arrays["x"], "x", where)
    held = "training samples" if "x_test" in arrays else "training and test samples"
    check_finite(x, "x", where, held)
    y = _check_labels(arrays["y"], "y", where, len(x))
    num_classes = int(y.max()) + 1 if y.size else 0
    if num_classes < 2:
        raise ValueError(f"{where}: y has {num_classes} class(es); at least 2 are needed")
    _check_present(y, "y", where)
    train = Samples(x)
    if "x_test" in arrays:
        x_test = _features(arrays["x_test"], "x_test", where)
        check_finite(x_test, "x_test", where, "test samples")
        y_test = _check_labels(arrays["y_test"], "y_test", where, len(x_test))
        if y_test.size and y_test.max() >= num_classes:
            raise ValueError(
                f"{where}: y_test has class {int(y_test.max())}, y only 0..{num_classes - 1}; "
                f"every class needs training samples"
            )
        test = Samples(x_test)
        train_y, test_y = y, y_test
    else:
        train_idx, test_idx = _stratified_split(y, test_fraction, data_seed)
        train, test = train[train_idx], train[test_idx]
        train_y, test_y = y[train_idx], y[test_idx]
    names = arrays.get("class_names")
    return _finish(
        "tensor_file",
        train,
        train_y,
        test,
        test_y,
        _class_names(names, num_classes, where),
        imbalance_factor,
        profile,
        data_seed,
        n_max,
        crop_padding,
        flip,
        val_per_class,
        Feeding(in_memory, memory_budget_gb, num_workers),
        where,
    )


# --- data=torchvision ---------------------------------------------------------------------


class ReadImage:
    """An item of a torchvision-style dataset as a tensor: the first element of a tuple, PIL
    images as uint8 (C, H, W), resized (shorter side) and centre-cropped to ``image_size``."""

    def __init__(self, image_size: int | None = None) -> None:
        self.image_size = image_size

    def __call__(self, dataset: Any, index: int) -> torch.Tensor:
        try:
            item = dataset[index]
        except Exception as error:  # the dataset's own code: a missing or corrupt file, ...
            source = ""
            if hasattr(dataset, "samples") and index < len(dataset.samples):
                source = f" ({dataset.samples[index][0]})"
            raise SampleError(
                f"data.dataset: cannot read sample {index}{source}: {type(error).__name__}: "
                f"{error}; remove or replace it"
            ) from None
        x = item[0] if isinstance(item, (tuple, list)) else item
        from PIL import Image
        from torchvision.transforms.v2 import functional as tf

        if self.image_size:
            x = tf.center_crop(tf.resize(x, self.image_size), self.image_size)
        if isinstance(x, Image.Image):
            x = tf.pil_to_tensor(x)
        x = torch.as_tensor(x)
        if x.dtype == torch.uint8 and x.dim() == 2:
            x = x.unsqueeze(0)
        return x


def _instantiate(node: Any, where: str) -> Any:
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    node = OmegaConf.create(node) if not OmegaConf.is_config(node) else node
    if "_target_" not in node:
        raise ValueError(
            f"{where}: needs _target_, the dataset class (e.g. torchvision.datasets.ImageFolder)"
        )
    try:
        return instantiate(node, _convert_="all")
    except InstantiationException as error:
        cause = error.__cause__ or error
        first = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        raise ValueError(
            f"{where} ({node._target_}): {first}; check the arguments under {where}"
        ) from None


def _dataset_labels(dataset: Any, where: str) -> np.ndarray:
    for attribute in ("targets", "labels"):
        labels = getattr(dataset, attribute, None)
        if labels is not None:
            return _check_labels(labels, f".{attribute}", where, len(dataset))
    raise ValueError(
        f"{where}: {type(dataset).__name__} has no .targets or .labels; give it one (the class "
        f"index of every sample) so labels are read without decoding the data"
    )


def torchvision_lt(
    dataset: Any,
    test: Any = None,
    test_fraction: float = 0.2,
    image_size: int | None = None,
    imbalance_factor: float | None = None,
    profile: str = "exp",
    data_seed: int = 0,
    n_max: int | None = None,
    crop_padding: int = 4,
    flip: bool = True,
    val_per_class: int = 0,
    in_memory: bool | None = None,
    memory_budget_gb: float | None = None,
    num_workers: int | None = None,
) -> LongTailData:
    """Any torchvision-style dataset class (``dataset._target_`` and its arguments): the training
    set; the test set is the same class with ``test`` merged over those arguments (e.g.
    ``{train: false}`` or ``{root: /data/test}``), or, with ``test`` null, a stratified split of
    ``test_fraction`` per class. Labels come from ``.targets`` or ``.labels`` (nothing is
    decoded for them), class names from ``.classes``. Items are decoded when read; the cut is
    applied to indices."""
    from omegaconf import OmegaConf

    node = dataset if OmegaConf.is_config(dataset) else OmegaConf.create(dataset)
    where = "data.dataset"
    if image_size is not None and image_size < 1:
        raise ValueError(f"data.image_size must be >= 1 pixels (or null), got {image_size}")
    train_set = _instantiate(node, where)
    train_y = _dataset_labels(train_set, where)
    if train_y.size == 0:
        raise ValueError(f"{where}: the dataset is empty")
    _check_present(train_y, "its labels", where)
    read = ReadImage(image_size)
    train = Samples(train_set, read=read)
    _check_sample(train, where)
    if test is not None:
        test_node = OmegaConf.merge(node, test)
        test_set = _instantiate(test_node, "data.test")
        test_y = _dataset_labels(test_set, "data.test")
        test_samples = Samples(test_set, read=read)
        _check_sample(test_samples, "data.test")
        train_classes, test_classes = (getattr(d, "classes", None) for d in (train_set, test_set))
        if (
            train_classes is not None
            and test_classes is not None
            and list(train_classes) != list(test_classes)
        ):
            raise ValueError(
                f"data.test: its classes {list(test_classes)[:5]}... differ from the "
                f"training set's {list(train_classes)[:5]}...; both need the same classes"
            )
    else:
        train_idx, test_idx = _stratified_split(train_y, test_fraction, data_seed)
        test_samples, test_y = train[test_idx], train_y[test_idx]
        train, train_y = train[train_idx], train_y[train_idx]
    num_classes = int(max(train_y.max(), test_y.max() if test_y.size else 0)) + 1
    classes = getattr(train_set, "classes", None)
    if classes is not None and len(classes) >= num_classes:
        num_classes = len(classes)
    else:
        classes = None
    return _finish(
        "torchvision",
        train,
        train_y,
        test_samples,
        test_y,
        _class_names(classes, num_classes, where),
        imbalance_factor,
        profile,
        data_seed,
        n_max,
        crop_padding,
        flip,
        val_per_class,
        Feeding(in_memory, memory_budget_gb, num_workers),
        where,
    )


def _check_sample(samples: Samples, where: str) -> None:
    """Read the first sample now, so that a dataset that cannot be read fails before training."""
    try:
        sample = samples.sample
    except SampleError as error:
        raise ValueError(str(error)) from None
    if not torch.is_tensor(sample) or sample.dim() < 1:
        raise ValueError(
            f"{where}: items must be images or tensors, got {type(sample).__name__}; set the "
            f"dataset's transform so that it returns one"
        )


def default_workers(samples: Any) -> int:
    """DataLoader workers when not configured: none for tensors, up to 4 for decoding."""
    if isinstance(samples, Samples) and samples.decodes:
        return min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2)
    return 0
