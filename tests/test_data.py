"""Data sources: long-tail counts, real on-disk formats written by the tests, augmentation."""

from __future__ import annotations

import pickle
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from runner import data
from runner.data.builtin import CIFAR_STATS

pytestmark = pytest.mark.unit  # in one process, seconds


@pytest.mark.parametrize(
    ("n_max", "classes", "factor", "total"),
    [(5000, 10, 100, 12_406), (5000, 10, 50, 13_996), (500, 100, 100, 10_847)],
)
def test_standard_cifar_lt_sizes(n_max, classes, factor, total):
    counts = data.long_tail_counts(n_max, classes, factor)
    assert sum(counts) == total
    assert counts[0] == n_max and counts[-1] == n_max // factor


def test_step_profile_and_bad_values():
    assert data.long_tail_counts(100, 5, 10, "step") == [100, 100, 100, 10, 10]
    with pytest.raises(ValueError, match="imbalance_factor must be >= 1"):
        data.long_tail_counts(100, 5, 0.5)
    with pytest.raises(ValueError, match="profile='linear' is unknown"):
        data.long_tail_counts(100, 5, 10, "linear")


def test_subset_is_fixed_by_the_data_seed():
    labels = np.repeat(np.arange(3), 10)
    a = data.long_tail_subset(labels, [10, 5, 2], data_seed=0)
    assert np.bincount(labels[a]).tolist() == [10, 5, 2]
    assert np.array_equal(a, data.long_tail_subset(labels, [10, 5, 2], data_seed=0))
    assert not np.array_equal(a, data.long_tail_subset(labels, [10, 5, 2], data_seed=1))


def test_synthetic_and_digits_follow_the_rule():
    synthetic = data.synthetic_lt(
        num_classes=5, dim=4, n_max=80, test_per_class=7, imbalance_factor=16
    )
    assert synthetic.train_counts.tolist() == data.long_tail_counts(80, 5, 16)
    assert torch.bincount(synthetic.test_y).tolist() == [7] * 5
    digits = data.digits_lt(test_per_class=50, imbalance_factor=10)
    assert digits.in_shape == (1, 8, 8) and digits.class_names == [str(d) for d in range(10)]
    assert torch.bincount(digits.test_y).tolist() == [50] * 10
    n_max = int(digits.train_counts[0])
    assert digits.train_counts.tolist() == data.long_tail_counts(n_max, 10, 10)


def write_cifar(root: Path, variant: str, train_per_class: int, test_per_class: int) -> None:
    """Tiny files in torchvision's real CIFAR on-disk format (pickled dicts of uint8 rows)."""
    rng = np.random.RandomState(0)
    classes = 10 if variant == "cifar10" else 100
    label_key = "labels" if variant == "cifar10" else "fine_labels"

    def batch(per_class: int) -> dict:
        labels = np.repeat(np.arange(classes), per_class)
        rng.shuffle(labels)
        # Pixel values encode the label, so the test can check images stay with their labels.
        pixels = np.repeat(labels[:, None] * 2, 3072, axis=1).astype(np.uint8)
        return {"data": pixels, label_key: labels.tolist()}

    def dump(path: Path, obj: dict) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pickle.dumps(obj))

    names = [f"c{i}" for i in range(classes)]
    if variant == "cifar10":
        folder = root / "cifar-10-batches-py"
        train = batch(train_per_class)
        for i in range(5):  # torchvision reads data_batch_1..5
            dump(folder / f"data_batch_{i + 1}", {k: v[i::5] for k, v in train.items()})
        dump(folder / "test_batch", batch(test_per_class))
        dump(folder / "batches.meta", {"label_names": names})
    else:
        folder = root / "cifar-100-python"
        dump(folder / "train", batch(train_per_class))
        dump(folder / "test", batch(test_per_class))
        dump(folder / "meta", {"fine_label_names": names})


@pytest.mark.parametrize("variant", ["cifar10", "cifar100"])
def test_cifar_on_files_in_the_real_format(tmp_path, variant):
    write_cifar(tmp_path, variant, train_per_class=20, test_per_class=3)
    ds = data.cifar_lt(variant, root=str(tmp_path), verify=False, imbalance_factor=10)
    classes = 10 if variant == "cifar10" else 100
    assert ds.train_counts.tolist() == data.long_tail_counts(20, classes, 10)
    assert torch.bincount(ds.test_y, minlength=classes).tolist() == [3] * classes
    assert ds.in_shape == (3, 32, 32) and ds.class_names[:2] == ["c0", "c1"]
    assert ds.train_x.dtype == torch.uint8  # 4x less memory; standardised one batch at a time
    assert torch.equal(ds.train_x[:, 0, 0, 0].long(), ds.train_y * 2)
    assert ds.normalize == CIFAR_STATS[variant]
    mean, std = CIFAR_STATS[variant]
    raw = data.to_model_input(ds.train_x, ds.normalize)[:, 0, 0, 0] * std[0] + mean[0]
    assert torch.allclose(raw * 255, ds.train_y.float() * 2, atol=1e-3)
    with pytest.raises(RuntimeError, match="not found or corrupted"):
        data.cifar_lt(
            variant, root=str(tmp_path), verify=True
        )  # tiny files fail torchvision's checksums


def test_missing_cifar_says_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="data.download=true"):
        data.cifar_lt("cifar10", root=str(tmp_path / "nowhere"))


def test_image_folder_decodes_once_and_caches(tmp_path):
    root = tmp_path / "images"
    for split, per_class in (("train", 6), ("test", 2)):
        for c, name in enumerate(["ant", "bee", "cat"]):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(per_class):
                Image.fromarray(np.full((8, 8, 3), 40 * c + i, np.uint8)).save(
                    folder / f"{i:04d}.png"
                )
    ds = data.image_folder_lt(str(root), cache_dir=str(tmp_path / "cache"), imbalance_factor=3)
    assert ds.class_names == ["ant", "bee", "cat"] and ds.in_shape == (3, 8, 8)
    assert ds.train_counts.tolist() == data.long_tail_counts(6, 3, 3)
    assert len(list((tmp_path / "cache").iterdir())) == 1
    again = data.image_folder_lt(str(root), cache_dir=str(tmp_path / "cache"), imbalance_factor=3)
    assert torch.equal(again.train_x, ds.train_x)
    with pytest.raises(FileNotFoundError, match="expected folders"):
        data.image_folder_lt(str(tmp_path / "empty"))


@pytest.mark.parametrize("pad,flip", [(4, True), (0, True), (2, False), (1, True)])
def test_batch_augmentation_is_flip_then_pad_then_crop_sample_by_sample(pad, flip):
    """The one-gather augmentation equals the plain recipe, one image at a time, from the same
    random numbers (flips, row offsets, column offsets, in that order)."""
    x = torch.randn(64, 3, 9, 7)
    out = data.augment_batch(x, data.Augment(pad, flip), torch.Generator().manual_seed(5))
    generator = torch.Generator().manual_seed(5)
    flips = torch.rand(64, generator=generator) < 0.5 if flip else torch.zeros(64, dtype=torch.bool)
    dy = torch.randint(0, 2 * pad + 1, (64,), generator=generator) if pad else torch.zeros(64)
    dx = torch.randint(0, 2 * pad + 1, (64,), generator=generator) if pad else torch.zeros(64)
    for i in range(64):
        image = x[i].flip(2) if flips[i] else x[i]
        padded = torch.nn.functional.pad(image, (pad, pad, pad, pad))
        top, left = int(dy[i]), int(dx[i])
        assert torch.equal(out[i], padded[:, top : top + 9, left : left + 7])


def test_batch_augmentation_crops_and_flips():
    x = torch.arange(2 * 1 * 4 * 4, dtype=torch.float32).reshape(2, 1, 4, 4)
    flipped = data.augment_batch(
        x, data.Augment(crop_padding=0, flip=True), torch.Generator().manual_seed(0)
    )
    for original, out in zip(x, flipped, strict=True):
        assert torch.equal(out, original) or torch.equal(out, original.flip(2))
    cropped = data.augment_batch(x, data.Augment(crop_padding=1), torch.Generator().manual_seed(1))
    assert cropped.shape == x.shape
    padded = torch.nn.functional.pad(x, (1, 1, 1, 1))
    for i in range(2):  # every output is some 4x4 window of the padded image
        windows = [padded[i, :, dy : dy + 4, dx : dx + 4] for dy in range(3) for dx in range(3)]
        assert any(torch.equal(cropped[i], w) for w in windows)


def test_a_validation_fraction_is_a_stratified_share_of_every_class_outside_training_and_test():
    """``data.val_fraction``: round(f * n_c) of every class (at least one), drawn before the
    cut with a seed of its own, so the training subset is the same with or without it."""
    from runner.data import tensor_file

    rng = np.random.RandomState(0)
    y = np.repeat(np.arange(3), [50, 20, 10])
    x = (rng.randn(y.size, 4) + y[:, None]).astype(np.float32)
    x[:, 0] = np.arange(y.size)  # each sample's row, to tell the splits apart
    path = Path(tempfile.mkdtemp()) / "features.npz"
    np.savez(path, x=x, y=y)

    def rows(samples) -> set[int]:
        return set(samples.__getitems__(list(range(len(samples))))[:, 0].long().tolist())

    ds = tensor_file(str(path), val_fraction=0.2, data_seed=3)
    # The pools after the test split (a fifth of every class) hold 40, 16 and 8 samples.
    assert torch.bincount(ds.val_y).tolist() == [8, 3, 2]
    assert not rows(ds.val_x) & rows(ds.train_x) and not rows(ds.val_x) & rows(ds.test_x)
    again = tensor_file(str(path), val_fraction=0.2, data_seed=3)
    assert rows(again.val_x) == rows(ds.val_x)  # seeded
    with pytest.raises(ValueError, match="give one of them"):
        tensor_file(str(path), val_fraction=0.2, val_per_class=2)
    with pytest.raises(ValueError, match=r"data.val_fraction must lie in \[0, 1\)"):
        tensor_file(str(path), val_fraction=1.0)


def test_synthetic_data_keeps_its_head_class_size_with_a_validation_fraction():
    ds = data.synthetic_lt(n_max=100, val_fraction=0.25, imbalance_factor=10)
    assert int(ds.train_counts[0]) == 100 and ds.val_y is not None
    assert (
        torch.bincount(ds.val_y).tolist() == [round(0.25 * 133)] * 10
    )  # 133 generated: 100 left after it


def test_uint8_channel_stats_are_the_float64_mean_and_std():
    from runner.data.samples import uint8_channel_stats

    x = torch.randint(0, 256, (50, 3, 7, 5), generator=torch.Generator().manual_seed(0))
    x = x.to(torch.uint8)
    mean, std = uint8_channel_stats(x)
    direct = x.double() / 255
    # Exact integer sums, one rounding: within a few float64 ulps of torch's own reduction.
    assert mean == pytest.approx(direct.mean(dim=(0, 2, 3)).tolist(), rel=1e-13)
    assert std == pytest.approx(direct.std(dim=(0, 2, 3)).tolist(), rel=1e-13)


def test_a_folder_key_is_its_files_in_path_order(tmp_path):
    """The image cache's key reads every file in the order of their path components (what
    ``sorted(Path)`` gives: ``a/b`` before ``a-c/d``, though ``"a-c" < "a/b"`` as strings), so
    a cache written by earlier versions is found again; a file's bytes change it."""
    import hashlib

    import torchvision

    from runner.data.builtin import DECODED_FORMAT, _folder_key

    for relative, content in (("a/b", b"1"), ("a-c/d", b"2"), ("a/e/f", b"3"), ("g", b"4")):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_bytes(content)
    expected = hashlib.sha256(f"{DECODED_FORMAT}:{torchvision.__version__}".encode())
    for relative, content in (("a/b", b"1"), ("a/e/f", b"3"), ("a-c/d", b"2"), ("g", b"4")):
        expected.update(f"\0{relative}\0".encode() + hashlib.sha256(content).digest())
    notes = tmp_path.parent / f"{tmp_path.name}-cache"  # outside the folder it keys
    assert _folder_key(tmp_path, notes) == expected.hexdigest()[:16]
    (tmp_path / "g").write_bytes(b"5")
    assert _folder_key(tmp_path, notes) != expected.hexdigest()[:16]
