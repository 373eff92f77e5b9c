"""Long-tailed data sources. Each yields its samples (tensors in memory, or
:class:`runner.sources.Samples` read on demand), class names and training counts.

The training set follows the standard long-tail rule n_i = int(n_max * (1/IF)^(i/(C-1))) (class 0
is the head); within each class a shuffle with a fixed data seed keeps the first n_i, so every
strategy and seed trains on the same subset. The test set stays balanced and untouched.
Images are kept as uint8 and converted (standardised per channel) one batch at a time
(:func:`to_model_input`); how they reach the model is :mod:`runner.feeding`'s choice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

PROFILES = ("exp", "step")
CIFAR_STATS = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


@dataclass
class Augment:
    """Batch augmentation for images: random crop after zero padding, horizontal flip."""

    crop_padding: int = 0
    flip: bool = False


@dataclass
class Feeding:
    """How the samples reach the model (see :mod:`runner.feeding`): ``in_memory`` None chooses
    by the memory budget (``memory_budget_gb`` None: a quarter of the available memory);
    ``num_workers`` None: 0 for tensors, up to 4 for datasets that decode."""

    in_memory: bool | None = None
    memory_budget_gb: float | None = None
    num_workers: int | None = None

    def __post_init__(self) -> None:
        if self.memory_budget_gb is not None and not self.memory_budget_gb > 0:
            raise ValueError(
                f"data.memory_budget_gb must be > 0 (or null: a quarter of the available "
                f"memory), got {self.memory_budget_gb}"
            )
        if self.num_workers is not None and self.num_workers < 0:
            raise ValueError(
                f"data.num_workers must be >= 0 (or null: automatic), got {self.num_workers}"
            )


Normalize = tuple[Sequence[float], Sequence[float]]


@dataclass
class LongTailData:
    """``*_x`` are tensors (in memory) or :class:`runner.sources.Samples` (read on demand);
    with ``normalize`` (per-channel mean, std) they hold uint8 images in [0, 255]."""

    train_x: Any
    train_y: torch.Tensor
    test_x: Any
    test_y: torch.Tensor
    class_names: list[str]
    name: str
    imbalance_factor: float
    augment: Augment | None = None
    val_x: Any = None  # balanced, carved from the training pool before the cut
    val_y: torch.Tensor | None = None
    normalize: Normalize | None = None
    feeding: Feeding = field(default_factory=Feeding)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def train_counts(self) -> torch.Tensor:
        return torch.bincount(self.train_y, minlength=self.num_classes)

    @property
    def in_shape(self) -> tuple[int, ...]:
        return tuple(self.train_x.shape[1:])


def long_tail_counts(
    n_max: int, num_classes: int, imbalance_factor: float, profile: str = "exp"
) -> list[int]:
    """Per-class training counts, head first."""
    if imbalance_factor < 1:
        raise ValueError(
            f"data.imbalance_factor must be >= 1 (1 = balanced), got {imbalance_factor}"
        )
    if profile not in PROFILES:
        raise ValueError(f"data.profile={profile!r} is unknown; choose one of {PROFILES}")
    if num_classes == 1:
        return [n_max]
    if profile == "step":
        head = num_classes - num_classes // 2
        return [n_max] * head + [int(n_max / imbalance_factor)] * (num_classes - head)
    return [
        int(n_max * (1.0 / imbalance_factor) ** (i / (num_classes - 1.0)))
        for i in range(num_classes)
    ]


def long_tail_subset(labels: np.ndarray, counts: Sequence[int], data_seed: int) -> np.ndarray:
    """Indices keeping the first ``counts[c]`` of each class after a fixed-seed shuffle."""
    rng = np.random.RandomState(data_seed)
    keep = []
    for c, n in enumerate(counts):
        members = np.flatnonzero(labels == c)
        if n > members.size:
            raise ValueError(
                f"data.n_max: class {c} has {members.size} samples, the long-tail profile asks for {n}; lower data.n_max to at most {members.size}"
            )
        rng.shuffle(members)
        keep.append(members[:n])
    return np.sort(np.concatenate(keep))


def _make_long_tailed(
    name: str,
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    class_names: list[str],
    imbalance_factor: float,
    profile: str,
    data_seed: int,
    n_max: int | None,
    augment: Augment | None,
    val_per_class: int = 0,
    normalize: Normalize | None = None,
    feeding: Feeding | None = None,
) -> LongTailData:
    """The validation split, the long-tail cut (``imbalance_factor`` None: the data's own
    counts, capped at ``n_max`` if given) and the checks. ``*_x`` are numpy arrays, tensors or
    :class:`runner.sources.Samples`; indexing the last composes indices and copies nothing."""
    val = np.empty(0, np.int64)
    if val_per_class:
        val = _validation_split(train_y, len(class_names), val_per_class, data_seed)
        rest = np.setdiff1d(np.arange(train_y.size), val)
        val_x, val_y = train_x[val], train_y[val]
        train_x, train_y = train_x[rest], train_y[rest]
    pool = np.bincount(train_y, minlength=len(class_names))
    if (pool == 0).any():
        empty = class_names[int(np.argmin(pool))]
        raise ValueError(
            f"class {empty!r} has no training samples; every class needs some (labels must "
            f"be 0..{len(class_names) - 1}, each present)"
        )
    if imbalance_factor is None:  # the data's own imbalance
        if n_max is not None and n_max < 1:
            raise ValueError(f"data.n_max must be >= 1, got {n_max}")
        counts = [int(min(n, n_max)) if n_max is not None else int(n) for n in pool]
        imbalance_factor = max(counts) / max(1, min(counts))
        n_max = max(counts)
    else:
        n_max = int(pool.min()) if n_max is None else n_max
        if n_max < 1:
            raise ValueError(f"data.n_max must be >= 1, got {n_max}")
        counts = long_tail_counts(n_max, len(class_names), imbalance_factor, profile)
    if min(counts) == 0:
        empty = class_names[counts.index(0)]
        enough = next(
            n
            for n in range(n_max, 10 * n_max + 10 * int(imbalance_factor) + 2)
            if min(long_tail_counts(n, len(class_names), imbalance_factor, profile)) > 0
        )
        raise ValueError(
            f"data.n_max={n_max} with data.imbalance_factor={imbalance_factor} leaves class "
            f"{empty!r} with no training samples; use data.n_max >= {enough} or lower "
            f"data.imbalance_factor to at most {n_max}"
        )
    tested = np.bincount(test_y, minlength=len(class_names))
    if (tested == 0).any():
        missing = [class_names[c] for c in np.flatnonzero(tested == 0)]
        raise ValueError(
            f"the test split has no samples of class(es) {missing}; every class needs test samples"
        )
    keep = long_tail_subset(train_y, counts, data_seed)
    return LongTailData(
        train_x=_tensor(train_x[keep]),
        train_y=torch.as_tensor(train_y[keep]).long(),
        test_x=_tensor(test_x),
        test_y=torch.as_tensor(test_y).long(),
        class_names=class_names,
        name=name,
        imbalance_factor=float(imbalance_factor),
        augment=augment,
        val_x=_tensor(val_x) if val.size else None,
        val_y=torch.as_tensor(val_y).long() if val.size else None,
        normalize=normalize,
        feeding=feeding or Feeding(),
    )


def _tensor(x: Any) -> Any:
    """numpy arrays become tensors; tensors and Samples stay as they are."""
    return torch.as_tensor(x) if isinstance(x, np.ndarray) else x


def to_model_input(x: torch.Tensor, normalize: Normalize | None) -> torch.Tensor:
    """One batch as the model takes it: uint8 images standardised per channel, in float32
    (the same operations, in the same order, whichever path the batch came by)."""
    if normalize is not None:  # sequences, or float32 tensors already on x's device
        mean, std = (
            torch.as_tensor(v, dtype=torch.float32, device=x.device)[:, None, None]
            for v in normalize
        )
        return x.float().div_(255.0).sub_(mean).div_(std)  # (x / 255 - mean) / std, in place
    return x if x.dtype == torch.float32 else x.float()


def _validation_split(
    labels: np.ndarray, num_classes: int, per_class: int, data_seed: int
) -> np.ndarray:
    """``per_class`` indices of every class, drawn with a seed of their own (so the long-tail
    cut that follows stays a pure function of data_seed), for choosing the best epoch honestly."""
    if per_class < 0:
        raise ValueError(f"data.val_per_class must be >= 0, got {per_class}")
    rng = np.random.RandomState(data_seed + 7919)
    chosen = []
    for c in range(num_classes):
        members = np.flatnonzero(labels == c)
        if members.size <= per_class:
            raise ValueError(
                f"data.val_per_class={per_class} leaves class {c} ({members.size} samples) nothing "
                f"to train on; use data.val_per_class < {members.size}"
            )
        chosen.append(rng.permutation(members)[:per_class])
    return np.sort(np.concatenate(chosen))


def synthetic_lt(
    num_classes: int = 10,
    dim: int = 32,
    n_max: int = 500,
    test_per_class: int = 100,
    separation: float = 3.0,
    noise: float = 1.0,
    imbalance_factor: float = 100.0,
    profile: str = "exp",
    data_seed: int = 0,
    val_per_class: int = 0,
    in_memory: bool | None = None,
    memory_budget_gb: float | None = None,
    num_workers: int | None = None,
) -> LongTailData:
    """Gaussian class clusters: means drawn at ``separation`` scale, isotropic ``noise``."""
    if num_classes < 2 or dim < 1 or n_max < 1 or test_per_class < 1:
        raise ValueError(
            "data: num_classes >= 2, dim >= 1, n_max >= 1 and test_per_class >= 1 are required"
        )
    for name, value in (("separation", separation), ("noise", noise)):
        if not (np.isfinite(value) and value >= 0):
            raise ValueError(f"data.{name} must be a finite number >= 0, got {value}")
    rng = np.random.RandomState(data_seed)
    means = rng.randn(num_classes, dim) * separation / np.sqrt(dim) * np.sqrt(2)

    def sample(per_class: int) -> tuple[np.ndarray, np.ndarray]:
        y = np.repeat(np.arange(num_classes), per_class)
        return (means[y] + noise * rng.randn(y.size, dim)).astype(np.float32), y

    train_x, train_y = sample(n_max + val_per_class)  # the validation split comes out of these
    test_x, test_y = sample(test_per_class)
    names = [f"class_{c}" for c in range(num_classes)]
    return _make_long_tailed(
        "synthetic_lt",
        train_x,
        train_y,
        test_x,
        test_y,
        names,
        imbalance_factor,
        profile,
        data_seed,
        n_max,
        None,
        val_per_class,
        None,
        Feeding(in_memory, memory_budget_gb, num_workers),
    )


def digits_lt(
    test_per_class: int = 50,
    n_max: int | None = None,
    imbalance_factor: float = 10.0,
    profile: str = "exp",
    data_seed: int = 0,
    crop_padding: int = 1,
    val_per_class: int = 0,
    in_memory: bool | None = None,
    memory_budget_gb: float | None = None,
    num_workers: int | None = None,
) -> LongTailData:
    """scikit-learn's bundled 8x8 digits: a balanced held-out test split, a long-tailed rest."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]  # (N, 1, 8, 8) in [0, 1]
    images = (images - 0.3) / 0.4
    labels = digits.target.astype(np.int64)
    rng = np.random.RandomState(data_seed)
    test = np.concatenate(
        [rng.permutation(np.flatnonzero(labels == c))[:test_per_class] for c in range(10)]
    )
    train = np.setdiff1d(np.arange(labels.size), test)
    names = [str(c) for c in range(10)]
    return _make_long_tailed(
        "digits_lt",
        images[train],
        labels[train],
        images[test],
        labels[test],
        names,
        imbalance_factor,
        profile,
        data_seed,
        n_max,
        Augment(crop_padding, flip=False),
        val_per_class,
        None,
        Feeding(in_memory, memory_budget_gb, num_workers),
    )


def cifar_lt(
    variant: str = "cifar10",
    root: str = "data",
    download: bool = False,
    verify: bool = True,
    imbalance_factor: float = 100.0,
    profile: str = "exp",
    data_seed: int = 0,
    n_max: int | None = None,
    val_per_class: int = 0,
    in_memory: bool | None = None,
    memory_budget_gb: float | None = None,
    num_workers: int | None = None,
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
    return _make_long_tailed(  # uint8 NCHW, standardised one batch at a time
        f"{variant}_lt",
        np.ascontiguousarray(train.data.transpose(0, 3, 1, 2)),
        np.asarray(train.targets),
        np.ascontiguousarray(test.data.transpose(0, 3, 1, 2)),
        np.asarray(test.targets),
        list(train.classes),
        imbalance_factor,
        profile,
        data_seed,
        n_max,
        Augment(crop_padding=4, flip=True),
        val_per_class,
        CIFAR_STATS[variant],
        Feeding(in_memory, memory_budget_gb, num_workers),
    )


def _class_folders(root: Path) -> list[str]:
    """The classes: the union of both splits' folders (sorted, so the first is the head); a
    class missing from, or empty in, either split is an error naming it."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    def images(folder: Path) -> list[Path]:
        return [p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMG_EXTENSIONS]

    present = {
        split: {d.name for d in (root / split).iterdir() if d.is_dir() and images(d)}
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


def _decode_folder(root: Path, cache_dir: Path) -> dict[str, object]:
    """Decode ``root/{train,test}/<class>/*`` once into uint8 tensors; later calls read the cache."""
    from torchvision import datasets
    from torchvision.io import ImageReadMode, decode_image

    classes = _class_folders(root)
    listing = sorted(
        str(p.relative_to(root)) + f":{p.stat().st_size}" for p in root.rglob("*") if p.is_file()
    )
    key = hashlib.sha256("\n".join([str(root.resolve()), *listing]).encode()).hexdigest()[:16]
    cache = cache_dir / f"image_folder-{key}.pt"
    if cache.exists():
        return torch.load(cache)

    class UnionOfSplits(datasets.ImageFolder):
        def find_classes(self, directory: str) -> tuple[list[str], dict[str, int]]:
            return classes, {c: i for i, c in enumerate(classes)}

    decoded: dict[str, object] = {"classes": classes}
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
    cache_dir.mkdir(parents=True, exist_ok=True)
    torch.save(decoded, cache)
    return decoded


def image_folder_lt(
    root: str,
    cache_dir: str = "data/cache",
    imbalance_factor: float = 100.0,
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
    """Any ``root/{train,test}/<class>/*`` tree (torchvision ImageFolder layout; classes in sorted
    folder order, so the first folder is the head class). Images must share one size."""
    path = Path(root).expanduser()
    for split in ("train", "test"):
        if not (path / split).is_dir():
            raise FileNotFoundError(
                f"data.root={root!r}: expected folders {path}/train/<class>/ and {path}/test/<class>/"
            )
    decoded = _decode_folder(path, Path(cache_dir).expanduser())
    train_x, test_x = decoded["train_x"], decoded["test_x"]
    mean = (train_x.double() / 255).mean(dim=(0, 2, 3)).tolist()
    std = (train_x.double() / 255).std(dim=(0, 2, 3)).tolist()
    return _make_long_tailed(  # uint8, standardised one batch at a time
        "image_folder_lt",
        train_x.numpy(),
        decoded["train_y"].numpy(),
        test_x.numpy(),
        decoded["test_y"].numpy(),
        list(decoded["classes"]),
        imbalance_factor,
        profile,
        data_seed,
        n_max,
        Augment(crop_padding, flip),
        val_per_class,
        (mean, std),
        Feeding(in_memory, memory_budget_gb, num_workers),
    )


def augment_batch(
    x: torch.Tensor,
    augment: Augment,
    generator: torch.Generator,
    share: tuple[int, int] = (0, 1),
) -> torch.Tensor:
    """Horizontal flip, then a random crop of the zero-padded image, for a whole batch at once.

    Both are one gather from ``x``: every output pixel reads its source pixel (or is zero, in
    the padding), so neither a flipped nor a padded copy of the batch is made. The random
    numbers are drawn as by flipping and padding step by step (flips, then row and column
    offsets), so a seed gives the same crops either way.

    ``share=(r, W)``: ``x`` is positions ``r, r + W, ...`` of a global batch W times as large
    (one of W data-parallel ranks); the draws are the whole global batch's, from the same
    generator, and ``x`` gets its positions' part, as one process augmenting it all would."""
    rank, ranks = share
    n, channels, h, w = x.shape
    drawn = n * ranks
    pad = augment.crop_padding
    if not augment.flip and pad == 0:
        return x
    if augment.flip:
        flip = (torch.rand(drawn, generator=generator) < 0.5)[rank::ranks]
    else:
        flip = torch.zeros(n, dtype=torch.bool)
    if pad > 0:
        dy = torch.randint(0, 2 * pad + 1, (drawn,), generator=generator)[rank::ranks] - pad
        dx = torch.randint(0, 2 * pad + 1, (drawn,), generator=generator)[rank::ranks] - pad
    else:
        dy = dx = torch.zeros(n, dtype=torch.long)
    device = x.device
    flip, dy, dx = flip.to(device), dy.to(device), dx.to(device)
    rows = dy[:, None] + torch.arange(h, device=device)  # source row of each output row
    columns = dx[:, None] + torch.arange(w, device=device)  # ... of the flipped image
    columns = torch.where(flip[:, None], w - 1 - columns, columns)  # ... of x itself
    inside = ((rows >= 0) & (rows < h))[:, :, None] & ((columns >= 0) & (columns < w))[:, None, :]
    source = rows.clamp(0, h - 1)[:, :, None] * w + columns.clamp(0, w - 1)[:, None, :]
    out = x.reshape(n, channels, h * w).gather(
        2, source.reshape(n, 1, h * w).expand(n, channels, h * w)
    )
    return out.view(n, channels, h, w).mul_(inside[:, None].to(out.dtype))
