"""The user's own data: tensors in a file (``data=tensor_file``) and any torchvision-style
dataset class (``data=torchvision``), kept where they are as :class:`runner.data.samples.Samples`
and cut to a long tail by index."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from runner.data.cut import LongTailCut, long_tail_source
from runner.data.samples import (
    ReadImage,
    SampleError,
    Samples,
    channel_stats,
    check_finite,
    is_image,
)
from runner.data.types import Augment, Feeding, LongTailData


def stratified_split(
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


def check_labels(y: Any, name: str, where: str, length: int) -> np.ndarray:
    """1-D integer labels 0..C-1, one per sample."""
    array = y.numpy() if torch.is_tensor(y) else np.asarray(y)
    if array.ndim == 2:
        raise ValueError(
            f"{where}: {name} is a {tuple(array.shape)} matrix; one class id per sample is a "
            f"1-D vector, and an (N, C) 0/1 label matrix (multi-label) is read by "
            f"data=multilabel_file"
        )
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


def check_present(labels: np.ndarray, name: str, where: str) -> None:
    """Every class 0..max has samples (else sampling and per-class metrics have a hole)."""
    absent = np.flatnonzero(np.bincount(labels) == 0)
    if absent.size:
        raise ValueError(
            f"{where}: {name} has no samples of class(es) {absent[:10].tolist()}; labels must be "
            f"0..C-1 with every class present (relabel: np.unique(y, return_inverse=True)[1])"
        )


def named_classes(names: Any, num_classes: int, where: str) -> list[str]:
    """The given names, one per class, or ``class_<c>``."""
    if names is None:
        return [f"class_{c}" for c in range(num_classes)]
    names = [str(n) for n in (names.tolist() if hasattr(names, "tolist") else names)]
    if len(names) != num_classes:
        raise ValueError(
            f"{where}: class_names has {len(names)} names for {num_classes} classes; give "
            f"one name per class or leave it out"
        )
    return names


def finish(
    *,
    name: str,
    train: tuple[Samples, np.ndarray],
    test: tuple[Samples, np.ndarray],
    class_names: list[str],
    augment: Augment,
    cut: LongTailCut,
    feeding: Feeding,
    where: str,
) -> LongTailData:
    """Shapes checked, images standardised with the training pool's statistics, then the
    splits and the cut (indices only). ``augment`` applies to images alone."""
    samples, test_samples = train[0], test[0]
    if tuple(test_samples.sample.shape) != tuple(samples.sample.shape):
        raise ValueError(
            f"{where}: test samples are {tuple(test_samples.sample.shape)}, training samples "
            f"{tuple(samples.sample.shape)}; they must have one shape"
        )
    image = is_image(samples.sample)
    return cut.apply(
        name=name,
        train=train,
        test=test,
        class_names=class_names,
        augment=augment if samples.sample.dim() == 3 else None,
        normalize=channel_stats(samples, cut.data_seed) if image else None,
        feeding=feeding,
    )


def load_tensor_file(path: Path, where: str) -> dict[str, Any]:
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


def read_tensor_file(path: str, where: str, labels: str) -> dict[str, Any]:
    """The arrays of the file at ``path`` (``data.path``), which must hold ``x`` and ``y``
    (``labels`` says what ``y`` holds), and ``x_test`` with ``y_test`` or neither."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(
            f"{where}: no such file; point data.path at an .npz or .pt file with x and y"
        )
    arrays = load_tensor_file(file, where)
    missing = [k for k in ("x", "y") if k not in arrays]
    if missing:
        raise ValueError(
            f"{where}: missing key(s) {missing} (found {sorted(arrays)}); save x (samples) "
            f"and y ({labels}), optionally x_test, y_test and class_names"
        )
    if ("x_test" in arrays) != ("y_test" in arrays):
        raise ValueError(f"{where}: has one of x_test and y_test; give both or neither")
    return arrays


def features_tensor(array: Any, key: str, where: str) -> torch.Tensor:
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


@long_tail_source()
def tensor_file(
    path: str,
    test_fraction: float = 0.2,
    crop_padding: int = 0,
    flip: bool = False,
    *,
    cut: LongTailCut,
    feeding: Feeding,
) -> LongTailData:
    """An ``.npz`` or ``.pt`` file with ``x`` (N, ...) and ``y`` (N,) integer labels 0..C-1, and
    optionally ``x_test``/``y_test`` (else a stratified split of ``test_fraction`` per class,
    seeded by ``data_seed``) and ``class_names``. ``x`` is float features or uint8 images
    (N, C, H, W) or (N, H, W), which are standardised per channel one batch at a time.
    ``imbalance_factor`` None keeps the data's own imbalance."""
    where = f"data.path={path!r}"
    arrays = read_tensor_file(path, where, "integer labels")
    x = features_tensor(arrays["x"], "x", where)
    held = "training samples" if "x_test" in arrays else "training and test samples"
    check_finite(x, "x", where, held)
    y = check_labels(arrays["y"], "y", where, len(x))
    num_classes = int(y.max()) + 1 if y.size else 0
    if num_classes < 2:
        raise ValueError(f"{where}: y has {num_classes} class(es); at least 2 are needed")
    check_present(y, "y", where)
    train = Samples(x)
    if "x_test" in arrays:
        x_test = features_tensor(arrays["x_test"], "x_test", where)
        check_finite(x_test, "x_test", where, "test samples")
        y_test = check_labels(arrays["y_test"], "y_test", where, len(x_test))
        if y_test.size and y_test.max() >= num_classes:
            raise ValueError(
                f"{where}: y_test has class {int(y_test.max())}, y only 0..{num_classes - 1}; "
                f"every class needs training samples"
            )
        test = Samples(x_test)
        train_y, test_y = y, y_test
    else:
        train_idx, test_idx = stratified_split(y, test_fraction, cut.data_seed)
        train, test = train[train_idx], train[test_idx]
        train_y, test_y = y[train_idx], y[test_idx]
    names = arrays.get("class_names")
    return finish(
        name="tensor_file",
        train=(train, train_y),
        test=(test, test_y),
        class_names=named_classes(names, num_classes, where),
        augment=Augment(crop_padding, flip),
        cut=cut,
        feeding=feeding,
        where=where,
    )


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
            return check_labels(labels, f".{attribute}", where, len(dataset))
    raise ValueError(
        f"{where}: {type(dataset).__name__} has no .targets or .labels; give it one (the class "
        f"index of every sample) so labels are read without decoding the data"
    )


@long_tail_source()
def torchvision_lt(
    dataset: Any,
    test: Any = None,
    test_fraction: float = 0.2,
    image_size: int | None = None,
    crop_padding: int = 4,
    flip: bool = True,
    *,
    cut: LongTailCut,
    feeding: Feeding,
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
    check_present(train_y, "its labels", where)
    read = ReadImage(image_size)
    train = Samples(train_set, read=read)
    check_sample(train, where)
    if test is not None:
        test_node = OmegaConf.merge(node, test)
        test_set = _instantiate(test_node, "data.test")
        test_y = _dataset_labels(test_set, "data.test")
        test_samples = Samples(test_set, read=read)
        check_sample(test_samples, "data.test")
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
        train_idx, test_idx = stratified_split(train_y, test_fraction, cut.data_seed)
        test_samples, test_y = train[test_idx], train_y[test_idx]
        train, train_y = train[train_idx], train_y[train_idx]
    num_classes = int(max(train_y.max(), test_y.max() if test_y.size else 0)) + 1
    classes = getattr(train_set, "classes", None)
    if classes is not None and len(classes) >= num_classes:
        num_classes = len(classes)
    else:
        classes = None
    return finish(
        name="torchvision",
        train=(train, train_y),
        test=(test_samples, test_y),
        class_names=named_classes(classes, num_classes, where),
        augment=Augment(crop_padding, flip),
        cut=cut,
        feeding=feeding,
        where=where,
    )


def check_sample(samples: Samples, where: str) -> None:
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
