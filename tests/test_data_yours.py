"""The user's own data (issue 11): tensors in a file, torchvision-style datasets, and the two ways
to feed the model (in memory, or a DataLoader) in one order. Every file is written by the test."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient
from PIL import Image
from torch.utils.data import DataLoader

from runner import data as data_module
from runner.data import Samples, tensor_file, torchvision_lt
from runner.data.samples import STATS_SAMPLES
from runner.train.feed import Feed, place
from samplers import FixedClassSampler, HardMinedSampler, WeightedSampler
from tests.conftest import compose_config
from tests.helpers.bad_files import BLANK_X, BLANK_Y, save_arrays

pytestmark = pytest.mark.unit  # in one process, seconds

QUICK = [
    "trainer.progress=false",
    "tracking.plots=false",
    "tracking.log_model=false",
    "trainer.threads=1",
]


def _only_run(uri: str):
    client = MlflowClient(uri)
    (found,) = client.search_runs([client.get_experiment_by_name("samplerlab").experiment_id])
    return client, found


def _history(client: MlflowClient, run_id: str, keys: list[str]) -> dict[str, list[float]]:
    return {k: [m.value for m in client.get_metric_history(run_id, k)] for k in keys}


def write_images(root: Path, counts: dict[str, int], size: tuple[int, int] = (8, 8)) -> Path:
    """``counts`` PNGs per class folder; pixel values tell the classes apart."""
    for c, (name, count) in enumerate(counts.items()):
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(count):
            pixels = np.full((*size, 3), 60 * c + 3 * i, np.uint8)
            pixels[: size[0] // 2, :, c % 3] = 255  # a class-specific pattern
            Image.fromarray(pixels).save(folder / f"{i:03d}.png")
    return root


class CountingDataset(torch.utils.data.Dataset):
    """A user's own torchvision-style class: ``.targets``, ``.classes``, items (image, label);
    counts how many items were decoded."""

    def __init__(self, n_per_class: list[int], size: int = 6) -> None:
        self.targets = [c for c, n in enumerate(n_per_class) for _ in range(n)]
        self.classes = [f"k{c}" for c in range(len(n_per_class))]
        self.size, self.decoded = size, 0

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        self.decoded += 1
        image = torch.full((3, self.size, self.size), i % 256, dtype=torch.uint8)
        return image, self.targets[i]


# --- sources -------------------------------------------------------------------------------


def test_npz_features_train_end_to_end_with_their_own_imbalance(tmp_path, tracking_uri):
    from runner.app import run

    rng = np.random.RandomState(0)
    y = np.repeat(np.arange(3), [60, 25, 10])
    x = (rng.randn(y.size, 6) + 2 * y[:, None]).astype(np.float32)
    path = tmp_path / "features.npz"
    np.savez(path, x=x, y=y, class_names=np.array(["ant", "bee", "cat"]))
    summary = run(
        compose_config(
            [
                "data=tensor_file",
                f"data.path={path}",
                "trainer.epochs=2",
                f"tracking.uri={tracking_uri}",
                *QUICK,
            ]
        )
    )
    _, found = _only_run(tracking_uri)
    assert found.info.status == "FINISHED" and "final/recall/cat" in summary
    metrics = found.data.metrics
    # imbalance_factor=null keeps the data's counts; 20% of every class is the test split.
    assert [metrics[f"data/train_count/{n}"] for n in ("ant", "bee", "cat")] == [48, 20, 8]
    assert [metrics[f"data/test_count/{n}"] for n in ("ant", "bee", "cat")] == [12, 5, 2]
    assert metrics["data/num_classes"] == 3 and not any("val_count" in k for k in metrics)
    assert found.data.tags["imbalance_factor"] == "6.0"


def test_pt_images_are_uint8_views_cut_by_index(tmp_path):
    """x (N, H, W) uint8 grey images with their own test split; the cut composes indices over the
    loaded (memory-mapped) tensor, and the in-memory path keeps them as uint8."""
    x = torch.arange(40 * 5 * 5).reshape(40, 5, 5).remainder(251).to(torch.uint8)
    y = torch.arange(40) % 4
    file = {"x": x, "y": y, "x_test": x[:8], "y_test": y[:8], "class_names": ["a", "b", "c", "d"]}
    torch.save(file, tmp_path / "images.pt")
    ds = tensor_file(str(tmp_path / "images.pt"), imbalance_factor=5)
    assert isinstance(ds.train_x, Samples) and ds.in_shape == (1, 5, 5)
    assert ds.train_x.dtype == torch.uint8 and ds.normalize is not None
    assert ds.train_counts.tolist() == data_module.long_tail_counts(10, 4, 5)
    assert ds.class_names == ["a", "b", "c", "d"] and ds.augment is not None
    rows = ds.train_x.indices
    assert torch.equal(ds.train_x.__getitems__(range(len(rows))), x[rows].unsqueeze(1))
    placed = place(ds, torch.device("cpu"))
    assert torch.is_tensor(placed.train_x) and placed.train_x.dtype == torch.uint8
    assert placed.train_x.shape == (len(rows), 1, 5, 5)


def test_a_users_dataset_class_is_cut_on_indices_without_decoding_for_labels():
    ds = torchvision_lt(
        {"_target_": f"{__name__}.CountingDataset", "n_per_class": [30, 14, 8]},
        imbalance_factor=4,
        n_max=20,
        test_fraction=0.2,
    )
    decoded = ds.train_x.base.decoded
    assert ds.class_names == ["k0", "k1", "k2"] and ds.in_shape == (3, 6, 6)
    assert ds.train_counts.tolist() == data_module.long_tail_counts(20, 3, 4)
    assert torch.bincount(ds.test_y).tolist() == [6, 3, 2]  # 20% of each class, rounded
    base = ds.train_x.base
    assert base is ds.test_x.base  # one dataset object; splits and the cut are index arrays
    assert [base.targets[i] for i in ds.train_x.indices] == ds.train_y.tolist()
    # Labels came from .targets: items were decoded for the shape checks (3) and the channel
    # statistics of the training pool (41 images here, at most STATS_SAMPLES) only.
    assert decoded <= 3 + min(STATS_SAMPLES, 41)


def test_image_folder_through_torchvision_over_the_budget_trains_through_a_dataloader(
    tmp_path, tracking_uri
):
    from runner.app import run
    from runner.build import build_parts

    write_images(tmp_path / "train", {"ant": 12, "bee": 6, "cat": 3}, size=(10, 12))
    write_images(tmp_path / "test", {"ant": 3, "bee": 3, "cat": 3}, size=(10, 12))
    overrides = [
        "data=torchvision",
        f"data.dataset.root={tmp_path / 'train'}",
        f"data.test={{root: {tmp_path / 'test'}}}",
        "data.image_size=8",  # resized (shorter side) and centre-cropped
        "data.memory_budget_gb=1e-6",  # 1 KiB: the data does not fit
        "data.num_workers=1",
        "model=small_cnn",
        "model.width=8",
        "trainer.epochs=2",
        "trainer.batch_size=8",
        f"tracking.uri={tracking_uri}",
        *QUICK,
    ]
    cfg = compose_config(overrides)
    parts = build_parts(cfg)
    assert isinstance(parts.data.train_x, Samples) and parts.data.in_shape == (3, 8, 8)
    assert parts.data.class_names == ["ant", "bee", "cat"]
    summary = run(cfg)
    _, found = _only_run(tracking_uri)
    assert found.info.status == "FINISHED" and "final/recall/cat" in summary
    assert found.data.metrics["data/train_count/cat"] == 3


# --- one order, two paths ------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 1])
def test_both_paths_visit_the_same_indices_in_the_same_order(workers):
    """x[i] holds i: what each path delivers is the index it read. Both paths follow the
    sampler's epoch, which is what a DataLoader fed by the sampler itself delivers."""
    n = 90
    labels = torch.arange(n) % 3
    x = torch.arange(n, dtype=torch.float32)[:, None].repeat(1, 2)
    for sampler, per_batch in (
        (WeightedSampler(labels, q=0.0, seed=5), 16),
        (FixedClassSampler(labels, classes_per_batch=3, samples_per_class=4, seed=5), 12),
    ):
        order = sampler.epoch_indices().reshape(-1)
        memory = torch.cat(list(Feed(x, torch.device("cpu")).batches(order, per_batch)))
        loader_feed = Feed(Samples(x), torch.device("cpu"), num_workers=workers)
        through = list(loader_feed.batches(order, per_batch, start=1))
        assert torch.equal(torch.cat(through)[:, 0].long(), order[per_batch:])
        assert torch.equal(memory[:, 0].long(), order)
        if sampler.batch_size:  # as a batch sampler
            plain = DataLoader(torch.arange(n), batch_sampler=sampler)
        else:
            plain = DataLoader(torch.arange(n), sampler=sampler, batch_size=per_batch)
        assert torch.equal(torch.cat(list(plain)), order)


def _images_file(tmp_path: Path) -> Path:
    rng = np.random.RandomState(1)
    y = np.repeat(np.arange(4), [40, 24, 14, 8])
    x = rng.randint(0, 60, size=(y.size, 3, 8, 8)).astype(np.uint8)
    for i, c in enumerate(y):  # learnable: class c brightens the top rows of one channel
        x[i, c % 3, : 2 + 2 * c] += 150
    path = tmp_path / "images.npz"
    np.savez(path, x=x, y=y)
    return path


def test_in_memory_and_dataloader_paths_give_identical_metrics(tmp_path, migrated_store):
    """uint8 images with crop and flip augmentation, hard_mined feedback: on the CPU, the same
    seed gives the same history whichever path feeds the model."""
    from runner.app import run

    path = _images_file(tmp_path)
    results = {}
    for in_memory in ("true", "false"):
        store = tmp_path / f"mlflow-{in_memory}.db"
        shutil.copy(migrated_store, store)
        uri = f"sqlite:///{store}"
        summary = run(
            compose_config(
                [
                    "data=tensor_file",
                    f"data.path={path}",
                    "data.crop_padding=1",
                    "data.flip=true",
                    f"data.in_memory={in_memory}",
                    "data.num_workers=1",
                    "sampler=hard_mined",
                    "model=small_cnn",
                    "model.width=8",
                    "trainer.epochs=3",
                    "trainer.batch_size=16",
                    f"tracking.uri={uri}",
                    *QUICK,
                ]
            )
        )
        client, found = _only_run(uri)
        keys = ["train/loss", "test/balanced_accuracy", "sampling/share/class_3"]
        results[in_memory] = (summary, _history(client, found.info.run_id, keys))
    assert results["true"] == results["false"]
    assert results["true"][0]["final/accuracy"] > 0.25  # it learned something


def test_the_dataloader_path_resumes_mid_epoch_exactly():

    from runner.config import trainer_config
    from runner.models import SmallCNN
    from runner.train.fit import train_epoch
    from runner.train.losses import ClassWeightedLoss
    from runner.train.state import build_state

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (96, 3, 6, 6), generator=g, dtype=torch.uint8)
    y = torch.arange(96) % 3
    norm = ([0.5] * 3, [0.25] * 3)
    cfg = trainer_config(epochs=2, batch_size=16, warmup_epochs=0)
    augment = data_module.Augment(crop_padding=1, flip=True)

    def fresh():
        torch.manual_seed(0)
        sampler = HardMinedSampler(y, seed=2)
        state = build_state(SmallCNN((3, 6, 6), 3, width=8), sampler, cfg, seed=0)
        return state, ClassWeightedLoss(torch.bincount(y), None, epochs=2)

    def feed(memory: bool) -> Feed:
        return Feed(x if memory else Samples(x), torch.device("cpu"), norm, num_workers=0)

    state, loss_fn = fresh()
    train_epoch(state, feed(True), y, loss_fn, 16, augment)
    expected = train_epoch(state, feed(True), y, loss_fn, 16, augment)

    class Stop(Exception):
        pass

    saved = {}

    def stop_after_two(loss: torch.Tensor) -> None:
        if state2.batch == 2:
            saved["state"] = copy.deepcopy(state2.state_dict())
            raise Stop

    state2, loss_fn2 = fresh()
    train_epoch(state2, feed(False), y, loss_fn2, 16, augment)
    with pytest.raises(Stop):
        train_epoch(state2, feed(False), y, loss_fn2, 16, augment, stop_after_two)
    state3, loss_fn3 = fresh()
    state3.load_state_dict(saved["state"])
    assert (state3.epoch, state3.batch) == (1, 2)
    again = train_epoch(state3, feed(False), y, loss_fn3, 16, augment)
    assert torch.equal(again.delivered, expected.delivered)
    assert torch.equal(again.losses, expected.losses) and again.mean_loss == expected.mean_loss


# --- bad files -----------------------------------------------------------------------------


X, Y = BLANK_X, BLANK_Y


@pytest.mark.parametrize(
    ("name", "write", "message"),
    [
        ("missing.npz", None, "no such file"),
        ("data.csv", lambda p: p.write_text("1,2\n"), "unknown file type .csv"),
        ("bad.npz", lambda p: p.write_bytes(b"not a zip"), "cannot read it as .npz"),
        ("bad.pt", lambda p: p.write_bytes(b"not a torch file"), "cannot read it as a torch file"),
        ("list.pt", lambda p: torch.save([1, 2], p), "not a dict"),
        ("noy.npz", lambda p: save_arrays(p, x=X), "missing key(s) ['y']"),
        ("short.npz", lambda p: save_arrays(p, x=X, y=Y[:7]), "7 labels for 10 samples"),
        (
            "float.npz",
            lambda p: save_arrays(p, x=X, y=Y.astype(np.float32)),
            "integer class indices",
        ),
        (
            "neg.pt",
            lambda p: save_arrays(p, x=torch.zeros(10, 3), y=torch.tensor(Y) - 1),
            "negative",
        ),
        ("half.npz", lambda p: save_arrays(p, x=X, y=Y, x_test=X), "x_test and y_test"),
        (
            "shape.npz",
            lambda p: save_arrays(p, x=X, y=Y, x_test=np.zeros((4, 5), np.float32), y_test=Y[:4]),
            "one shape",
        ),
        ("names.npz", lambda p: save_arrays(p, x=X, y=Y, class_names=np.array(["a"])), "1 names"),
        ("gap.npz", lambda p: save_arrays(p, x=X, y=Y * 2), "no samples of class(es) [1]"),
        (
            "ints.npz",
            lambda p: save_arrays(p, x=X.astype(np.int32), y=Y),
            "float features or uint8",
        ),
    ],
)
def test_bad_tensor_files_name_the_parameter_and_the_fix(tmp_path, name, write, message):
    path = tmp_path / name
    if write is not None:
        write(path)
    with pytest.raises((ValueError, FileNotFoundError)) as error:
        tensor_file(str(path))
    assert message in str(error.value) and "data.path" in str(error.value)
    assert len(str(error.value).splitlines()) <= 2


def test_bad_datasets_name_the_parameter_and_the_fix(tmp_path):
    with pytest.raises(ValueError, match=r"data.dataset \(torchvision.datasets.ImageFolder\)"):
        torchvision_lt({"_target_": "torchvision.datasets.ImageFolder", "root": str(tmp_path)})
    with pytest.raises(ValueError, match="has no .targets or .labels"):
        torchvision_lt({"_target_": "torch.utils.data.TensorDataset"})
    write_images(tmp_path / "a", {"x": 4, "y": 4}, size=(8, 8))
    write_images(tmp_path / "b", {"x": 4, "z": 4}, size=(8, 8))
    with pytest.raises(ValueError, match="both need the same classes"):
        torchvision_lt(
            {"_target_": "torchvision.datasets.ImageFolder", "root": str(tmp_path / "a")},
            test={"root": str(tmp_path / "b")},
        )


class NonFiniteDataset(CountingDataset):
    """A user's class whose transform returns float images; one of them holds a NaN."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image = super().__getitem__(i)[0].float() / 255
        if i == 7:
            image[0, 1, 1] = float("nan")
        return image, self.targets[i]


@pytest.mark.parametrize("in_memory", [True, False])
def test_a_dataset_that_decodes_a_non_finite_sample_is_named_before_training(in_memory):
    """In memory every sample is read before anything is recorded; through a DataLoader the
    sample is checked when read, and the epoch stops at it with the same one line."""
    from runner.errors import UserError

    data = torchvision_lt(
        {"_target_": "tests.test_data_yours.NonFiniteDataset", "n_per_class": [6, 6]},
        test_fraction=0.25,
        in_memory=in_memory,
        crop_padding=0,
        flip=False,
    )
    with pytest.raises(UserError, match=r"data.dataset: sample 7 holds nan") as error:
        placed = place(data, torch.device("cpu"))
        feed = Feed(placed.train_x, torch.device("cpu"), num_workers=0)
        list(feed.batches(torch.arange(len(feed)), 4))
        list(Feed(placed.test_x, torch.device("cpu"), num_workers=0).batches(torch.arange(3), 4))
    assert len(str(error.value).splitlines()) == 1


def test_the_docs_commands_for_your_data_compose():
    """Every command of docs/your-data.md composes and names only parameters its target takes."""
    import shlex

    from runner.checks import check_targets
    from tests.conftest import ROOT

    page = (ROOT / "docs" / "your-data.md").read_text()
    commands = [line for line in page.splitlines() if line.startswith("python -m runner ")]
    assert len(commands) >= 6
    for command in commands:
        cfg = compose_config(shlex.split(command)[3:])
        check_targets(cfg)
        assert cfg.data._target_ in ("runner.data.tensor_file", "runner.data.torchvision_lt")
