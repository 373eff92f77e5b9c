"""The built-in sources: synthetic Gaussian clusters, scikit-learn's digits, CIFAR through
torchvision, and any image folder tree. Each returns its data cut to a long tail
(:class:`runner.data.cut.LongTailCut`); images stay uint8 and are standardised one batch at a
time (:func:`runner.data.batch.to_model_input`)."""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from runner import cache_dirs
from runner.data.cut import LongTailCut, long_tail_source
from runner.data.samples import uint8_channel_stats
from runner.data.types import Augment, Feeding, LongTailData
from runner.files import (
    listed_while_unchanged,
    noted_while_unchanged,
    while_unchanged,
    write_atomically,
)

DECODED_FORMAT = 2  # of the decoded image-folder caches (2: keyed by the files' bytes)
CIFAR_STATS = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


@long_tail_source(imbalance_factor=100.0, n_max=500)
def synthetic_lt(
    num_classes: int = 10,
    dim: int = 32,
    test_per_class: int = 100,
    separation: float = 3.0,
    noise: float = 1.0,
    *,
    cut: LongTailCut,
    feeding: Feeding,
) -> LongTailData:
    """Gaussian class clusters: means drawn at ``separation`` scale, isotropic ``noise``;
    ``n_max`` training samples of the head class after the validation split."""
    n_max = cut.n_max
    if n_max is None:
        raise ValueError("data.n_max: synthetic_lt generates n_max samples per class; give one")
    if num_classes < 2 or dim < 1 or test_per_class < 1:
        raise ValueError("data: num_classes >= 2, dim >= 1 and test_per_class >= 1 are required")
    for name, value in (("separation", separation), ("noise", noise)):
        if not (np.isfinite(value) and value >= 0):
            raise ValueError(f"data.{name} must be a finite number >= 0, got {value}")
    rng = np.random.RandomState(cut.data_seed)
    means = rng.randn(num_classes, dim) * separation / np.sqrt(dim) * np.sqrt(2)

    def sample(per_class: int) -> tuple[np.ndarray, np.ndarray]:
        y = np.repeat(np.arange(num_classes), per_class)
        return (means[y] + noise * rng.randn(y.size, dim)).astype(np.float32), y

    train_x, train_y = sample(n_max + _held_out(cut, n_max))
    test_x, test_y = sample(test_per_class)
    names = [f"class_{c}" for c in range(num_classes)]
    return cut.apply(
        name="synthetic_lt",
        train=(train_x, train_y),
        test=(test_x, test_y),
        class_names=names,
        augment=None,
        normalize=None,
        feeding=feeding,
    )


def _held_out(cut: LongTailCut, n_max: int) -> int:
    """Samples per class to generate beyond ``n_max`` so that ``n_max`` remain after the
    validation split."""
    held = 0
    while (
        cut.val_fraction and n_max + held - max(1, round(cut.val_fraction * (n_max + held))) < n_max
    ):
        held += 1
    return cut.val_per_class or held


@long_tail_source(imbalance_factor=10.0)
def digits_lt(
    test_per_class: int = 50,
    crop_padding: int = 1,
    *,
    cut: LongTailCut,
    feeding: Feeding,
) -> LongTailData:
    """scikit-learn's bundled 8x8 digits: a balanced held-out test split, a long-tailed rest."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]  # (N, 1, 8, 8) in [0, 1]
    images = (images - 0.3) / 0.4
    labels = digits.target.astype(np.int64)
    rng = np.random.RandomState(cut.data_seed)
    test = np.concatenate(
        [rng.permutation(np.flatnonzero(labels == c))[:test_per_class] for c in range(10)]
    )
    train = np.setdiff1d(np.arange(labels.size), test)
    names = [str(c) for c in range(10)]
    return cut.apply(
        name="digits_lt",
        train=(images[train], labels[train]),
        test=(images[test], labels[test]),
        class_names=names,
        augment=Augment(crop_padding, flip=False),
        normalize=None,
        feeding=feeding,
    )


@long_tail_source(imbalance_factor=100.0)
def cifar_lt(
    variant: str = "cifar10",
    root: str = "data",
    download: bool = False,
    verify: bool = True,
    *,
    cut: LongTailCut,
    feeding: Feeding,
) -> LongTailData:
    """CIFAR-10-LT or CIFAR-100-LT (``variant``) through torchvision; downloads only with
    ``download=True``. ``n_max`` defaults to the full class size (5,000 or 500)."""
    from torchvision import datasets

    if variant not in CIFAR_STATS:
        raise ValueError(
            f"data.variant={variant!r} is unknown; choose one of {sorted(CIFAR_STATS)}"
        )
    base = datasets.CIFAR10 if variant == "cifar10" else datasets.CIFAR100
    folder = Path(root).expanduser() / base.base_folder
    if not download and not folder.is_dir():
        raise FileNotFoundError(
            f"data.root={root!r}: no {variant.upper()} found at {folder}. Run once with "
            f"data.download=true on a machine with internet access, or copy the python version "
            f"('{base.base_folder}') there and point data.root at its parent."
        )
    # verify=false accepts files whose checksums differ from the official release (small test
    # files in the same on-disk format, or a local re-export); the reading code is torchvision's.
    cls = base
    if not verify:  # torchvision's own checks, with checksums reduced to "the file exists"
        cls = type(
            base.__name__,
            (base,),
            {
                "train_list": [[name, None] for name, _ in base.train_list],
                "test_list": [[name, None] for name, _ in base.test_list],
                "meta": {**base.meta, "md5": None},
            },
        )
    train = cls(root=str(Path(root).expanduser()), train=True, download=download)
    test = cls(root=str(Path(root).expanduser()), train=False, download=False)
    return cut.apply(
        name=f"{variant}_lt",
        train=(np.ascontiguousarray(train.data.transpose(0, 3, 1, 2)), np.asarray(train.targets)),
        test=(np.ascontiguousarray(test.data.transpose(0, 3, 1, 2)), np.asarray(test.targets)),
        class_names=list(train.classes),
        augment=Augment(crop_padding=4, flip=True),
        normalize=CIFAR_STATS[variant],
        feeding=feeding,
    )


def _class_folders(root: Path) -> list[str]:
    """The classes: the union of both splits' folders (sorted, so the first is the head); a
    class missing from, or empty in, either split is an error naming it."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    def has_images(folder: Path) -> bool:
        return any(p.suffix.lower() in IMG_EXTENSIONS and p.is_file() for p in folder.iterdir())

    present = {
        split: {d.name for d in (root / split).iterdir() if d.is_dir() and has_images(d)}
        for split in ("train", "test")
    }
    classes = sorted(present["train"] | present["test"])
    for split in ("train", "test"):
        missing = [c for c in classes if c not in present[split]]
        if missing:
            raise ValueError(
                f"data.root={str(root)!r}: class(es) {missing} have no images in {split}/; "
                f"every class needs a folder with images in both train/ and test/"
            )
    return classes


def _folder_key(root: Path, notes: Path) -> str:
    """A digest of what decoding ``root`` gives: every file's relative path and bytes, and the
    decoder's version (torchvision's). Files rewritten in place, with the same names, sizes and
    times, give another key. The folders are listed and the files read once while none of them
    changes (:func:`runner.files.listed_while_unchanged`): once per process
    (:func:`runner.files.while_unchanged`: every job of a sweep builds the data again) and,
    noted in ``notes`` (the decoded images' cache folder), once for every process
    (:func:`runner.files.noted_while_unchanged`: reading every image again took seconds)."""
    import torchvision

    # Into linked folders, as torchvision's ImageFolder, which decodes them, goes.
    files, paths = listed_while_unchanged(str(root))

    def digest() -> str:
        slot = ("image_folder", str(DECODED_FORMAT), torchvision.__version__, str(root))
        return noted_while_unchanged(notes, slot, paths, lambda: _digest(files, paths))

    return while_unchanged(("image folder", str(root)), paths, digest)


def _digest(files: Sequence[str], paths: Sequence[str]) -> str:
    """:func:`_folder_key`'s digest of the files (relative names ``files`` at ``paths``)."""
    import torchvision

    digest = hashlib.sha256(f"{DECODED_FORMAT}:{torchvision.__version__}".encode())
    for relative, path in zip(files, paths, strict=True):
        if os.path.isfile(path):
            digest.update(f"\0{relative}\0".encode())
            with open(path, "rb") as handle:
                digest.update(hashlib.sha256(handle.read()).digest())
    return digest.hexdigest()[:16]


def _read_decoded(cache: Path) -> dict[str, Any] | None:
    """The decoded folder cached at ``cache``, with its training images' channel statistics
    (``train_stats``); None (after one line) when it cannot be read."""
    try:
        decoded: dict[str, Any] = torch.load(cache, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many kinds for a damaged file
        print(f"data: {cache} is unreadable ({type(error).__name__}); decoding again", flush=True)
        return None
    decoded["train_stats"] = uint8_channel_stats(decoded["train_x"])
    return decoded


def _decode_folder(root: Path, cache_dir: Path) -> dict[str, Any]:
    """Decode ``root/{train,test}/<class>/*`` once into uint8 tensors; later calls read the
    cache, keyed by the files' contents (:func:`_folder_key`)."""
    from torchvision import datasets
    from torchvision.io import ImageReadMode, decode_image

    classes = _class_folders(root)
    cache = cache_dir / f"image_folder-{_folder_key(root, cache_dir)}.pt"
    if cache.is_file():
        # Every job of a sweep reads the same cache: once per process while the file is as it
        # was (the caller copies what it hands on rather than sharing these tensors).
        cached = while_unchanged(
            ("decoded images", str(cache)), [str(cache)], lambda: _read_decoded(cache)
        )
        if cached is not None:
            return cached

    class UnionOfSplits(datasets.ImageFolder):
        def find_classes(self, directory: str) -> tuple[list[str], dict[str, int]]:
            return classes, {c: i for i, c in enumerate(classes)}

    decoded: dict[str, Any] = {"classes": classes}
    shape = None
    for split in ("train", "test"):
        folder = UnionOfSplits(str(root / split))
        images = []
        for path, _ in folder.samples:
            try:
                image = decode_image(path, mode=ImageReadMode.RGB)
            except (RuntimeError, ValueError) as error:
                raise ValueError(
                    f"data.root: cannot decode {path} ({error}); remove or replace the file"
                ) from None
            if shape is None:
                shape = tuple(image.shape)
            elif tuple(image.shape) != shape:
                raise ValueError(
                    f"data.root: {path} is {image.shape[2]}x{image.shape[1]}, the first image was "
                    f"{shape[2]}x{shape[1]}; resize the images to one size"
                )
            images.append(image)
        decoded[f"{split}_x"] = torch.stack(images)
        decoded[f"{split}_y"] = torch.tensor(folder.targets)
    buffer = io.BytesIO()  # serialised first: torch's own file writer hides an OSError
    torch.save(decoded, buffer)
    write_atomically(cache, buffer.getbuffer())  # a reader finds the whole file or none
    decoded["train_stats"] = uint8_channel_stats(decoded["train_x"])
    return decoded


@long_tail_source(imbalance_factor=100.0)
def image_folder_lt(
    root: str,
    cache_dir: str | None = None,
    crop_padding: int = 4,
    flip: bool = True,
    *,
    cut: LongTailCut,
    feeding: Feeding,
) -> LongTailData:
    """Any ``root/{train,test}/<class>/*`` tree (torchvision ImageFolder layout; classes in sorted
    folder order, so the first folder is the head class). Images must share one size."""
    path = Path(root).expanduser()
    for split in ("train", "test"):
        if not (path / split).is_dir():
            raise FileNotFoundError(
                f"data.root={root!r}: expected folders {path}/train/<class>/ and {path}/test/<class>/"
            )
    decoded = _decode_folder(path, Path(cache_dir or cache_dirs.folder("images")).expanduser())
    # The cut copies the training rows it keeps; the test rows and the statistics are copied
    # here: what was decoded is the next job's too.
    mean, std = decoded["train_stats"]
    return cut.apply(
        name="image_folder_lt",
        train=(decoded["train_x"].numpy(), decoded["train_y"].numpy()),
        test=(decoded["test_x"].numpy().copy(), decoded["test_y"].numpy().copy()),
        class_names=list(decoded["classes"]),
        augment=Augment(crop_padding, flip),
        normalize=(list(mean), list(std)),
        feeding=feeding,
    )
