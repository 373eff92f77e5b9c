"""The feature cache is keyed by what the backbone sees and by the backbone itself: other pixels
behind the same file names, sizes and times, another transform, another dataset object, a
random transform or an edited forward never get features computed for something else."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image
from torch.utils.data import Dataset

from runner.build import build, build_model, freeze
from runner.data import LongTailData
from runner.models.source import code_digest
from runner.train.feed import place
from tests.conftest import compose_config

pytestmark = pytest.mark.unit

CPU = torch.device("cpu")
SMALL_CNN = ("model=small_cnn", "model.width=4")
STAMP_NS = 1_700_000_000_000_000_000  # one mtime for every image file


def write_folder(root: Path, seed: int) -> Path:
    """Two classes of six 8x8 PNG images (stored uncompressed: the size is the same whatever the
    pixels), drawn from ``seed``, every file with the same mtime."""
    rng = np.random.RandomState(seed)
    for name in ("ant", "bee"):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(6):
            file = root / name / f"{i}.png"
            Image.fromarray(rng.randint(0, 256, (8, 8, 3), np.uint8)).save(file, compress_level=0)
            os.utime(file, ns=(STAMP_NS, STAMP_NS))
    return root


def listing(root: Path) -> list[tuple[str, int, int]]:
    return sorted(
        (str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*.png")
    )


def frozen(
    cache: Path, *overrides: str, model: tuple[str, ...] = SMALL_CNN, dataset: dict | None = None
) -> tuple:
    """The features of every split ``freeze`` makes of the composed config (with ``dataset`` as
    ``data.dataset``); the lines it printed are left for capsys."""
    cfg = compose_config(
        [
            *overrides,
            *model,
            "model.freeze=true",
            "trainer.augment=false",
            f"features.cache_dir={cache}",
        ]
    )
    if dataset is not None:
        cfg.data.dataset = OmegaConf.create(dataset)
    data: LongTailData = place(build("data", cfg.data), CPU)
    torch.manual_seed(0)
    net = build_model(cfg.model, data.in_shape, data.num_classes)
    _, swapped, _ = freeze(net, data, cfg, CPU)
    return swapped.train_x, swapped.test_x


def folder_overrides(root: Path, *extra: str) -> list[str]:
    return [
        "data=torchvision",
        f"data.dataset.root={root}",
        "data.test_fraction=0.34",
        "data.in_memory=false",  # through a DataLoader: the path whose key hashed file names
        "data.num_workers=0",
        *extra,
    ]


def last_line(capsys) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_folders_alike_in_names_sizes_and_times_but_not_pixels_get_their_own_features(
    tmp_path, capsys
):
    first, second = write_folder(tmp_path / "one", 1), write_folder(tmp_path / "two", 2)
    assert listing(first) == listing(second)
    cache = tmp_path / "cache"
    a = frozen(cache, *folder_overrides(first))
    assert last_line(capsys).startswith("features: computed ")
    assert frozen(cache, *folder_overrides(first))[0].equal(a[0])
    assert last_line(capsys).startswith("features: reused ")
    b = frozen(cache, *folder_overrides(second))
    assert last_line(capsys).startswith("features: computed ")
    assert not torch.equal(a[0], b[0]) and not torch.equal(a[1], b[1])
    # The same folder rewritten in place, names, sizes and times kept: its own features again.
    write_folder(first, 2)
    assert listing(first) == listing(second)
    c = frozen(cache, *folder_overrides(first))
    assert last_line(capsys).startswith("features: reused ")  # they are the second folder's
    assert torch.equal(c[0], b[0]) and torch.equal(c[1], b[1])


def test_a_changed_transform_gets_its_own_features(tmp_path, capsys):
    root, cache = write_folder(tmp_path / "images", 3), tmp_path / "cache"
    plain = frozen(cache, *folder_overrides(root))
    grey = "+data.dataset.transform={_target_: torchvision.transforms.Grayscale, num_output_channels: 3}"
    capsys.readouterr()
    changed = frozen(cache, *folder_overrides(root, grey))
    assert last_line(capsys).startswith("features: computed ")
    assert not torch.equal(plain[0], changed[0])


def test_an_image_folder_rewritten_in_place_is_decoded_and_featured_again(tmp_path, capsys):
    """``data=image_folder_lt`` decodes into its own cache first: that cache is keyed by the
    files' bytes too."""
    root, cache = tmp_path / "images", tmp_path / "cache"
    for split, seed in (("train", 4), ("test", 5)):
        write_folder(root / split, seed)
    args = [
        "data=image_folder_lt",
        f"data.root={root}",
        f"data.cache_dir={tmp_path / 'decoded'}",
        "data.imbalance_factor=2",
    ]
    before = frozen(cache, *args)
    stamps = listing(root)
    for split, seed in (("train", 6), ("test", 7)):
        write_folder(root / split, seed)
    assert listing(root) == stamps
    capsys.readouterr()
    after = frozen(cache, *args)
    assert last_line(capsys).startswith("features: computed ")
    assert not torch.equal(before[0], after[0])
    assert len(list((tmp_path / "decoded").glob("*.pt"))) == 2


class Pixels(Dataset):
    """A dataset object with no ``.samples`` (no files to list): 8x8 images drawn from
    ``seed``; ``jitter`` draws every read anew (a random transform)."""

    def __init__(self, seed: int, jitter: bool = False) -> None:
        self.images = torch.from_numpy(
            np.random.RandomState(seed).randint(0, 256, (24, 3, 8, 8), np.uint8)
        )
        self.targets = [i % 2 for i in range(24)]
        self.jitter = jitter

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.images[index]
        if self.jitter:
            image = image ^ torch.randint(0, 2, image.shape, dtype=torch.uint8)
        return image, self.targets[index]


FEED = ("data=torchvision", "data.in_memory=false", "data.num_workers=0")


def pixels(seed: int, jitter: bool = False) -> dict:
    return {"_target_": f"{__name__}.Pixels", "seed": seed, "jitter": jitter}


def test_another_dataset_object_with_other_pixels_gets_its_own_features(tmp_path, capsys):
    first = frozen(tmp_path, *FEED, dataset=pixels(1))
    second = frozen(tmp_path, *FEED, dataset=pixels(2))
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[1] for line in lines] == ["computed", "computed"], lines
    assert not torch.equal(first[0], second[0])


def test_a_dataset_that_reads_differently_every_time_is_not_cached(tmp_path, capsys):
    frozen(tmp_path / "cache", *FEED, dataset=pixels(1, jitter=True))
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("features: train: not cached: the data gave other inputs")
    assert lines[-1].startswith("features: computed ") and lines[-1].endswith("; not cached)")
    assert not list((tmp_path / "cache").glob("**/*.pt"))


NET = """
from torch import nn

from {helper} import {step}


class Net(nn.Module):
    def __init__(self, in_shape, num_classes):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 16))
        self.out = nn.Linear(16, num_classes)

    def forward(self, x):
        return self.out({step}(self.body(x)))
"""


def write_net(folder: Path, module: str, step: str, helper: str = "torch") -> None:
    (folder / f"{module}.py").write_text(NET.format(helper=helper, step=step))
    importlib.invalidate_caches()
    if module in sys.modules:
        importlib.reload(sys.modules[module])


@pytest.fixture
def user_modules():
    """The modules a test writes and imports are gone from ``sys.modules`` after it."""
    yield
    for name in [n for n in sys.modules if n.startswith(("edited_", "keyed_"))]:
        sys.modules.pop(name)


def test_an_edited_forward_or_helper_of_the_users_backbone_gets_its_own_features(
    tmp_path, monkeypatch, capsys, user_modules
):
    monkeypatch.syspath_prepend(str(tmp_path))
    # No bytecode cache: an edit of the same size within a second would load the old code.
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    model = ("model=custom", "model._target_=edited_net.Net")
    write_net(tmp_path, "edited_net", "relu")
    first = frozen(tmp_path / "cache", "data=digits_lt", model=model)
    frozen(tmp_path / "cache", "data=digits_lt", model=model)
    assert last_line(capsys).startswith("features: reused ")
    write_net(tmp_path, "edited_net", "sigmoid")  # the same parameters, another forward
    second = frozen(tmp_path / "cache", "data=digits_lt", model=model)
    assert last_line(capsys).startswith("features: computed ")
    assert not torch.equal(first[0], second[0])
    # A helper in another file of the user's, edited: the module that imports it is the same.
    (tmp_path / "edited_steps.py").write_text(
        "import torch\n\ndef step(x):\n    return torch.tanh(x)\n"
    )
    write_net(tmp_path, "edited_net", "step", helper="edited_steps")
    tanh = frozen(tmp_path / "cache", "data=digits_lt", model=model)
    (tmp_path / "edited_steps.py").write_text(
        "import torch\n\ndef step(x):\n    return torch.relu(x)\n"
    )
    importlib.reload(sys.modules["edited_steps"])
    write_net(tmp_path, "edited_net", "step", helper="edited_steps")
    capsys.readouterr()
    relu = frozen(tmp_path / "cache", "data=digits_lt", model=model)
    assert last_line(capsys).startswith("features: computed ")
    assert not torch.equal(tanh[0], relu[0])
    assert torch.equal(relu[0], first[0])  # relu again: the same features as the first


KEYED_NET = """
from torch import nn

from .settings import SCALE


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)

    def forward(self, x):
        import keyed_helpers  # imported when forward first runs: not yet when the key is made

        return keyed_helpers.step(self.body(x)) * SCALE
"""


def test_a_constant_imported_by_name_or_a_module_imported_in_a_function_is_in_the_code_digest(
    tmp_path, monkeypatch, user_modules
):
    monkeypatch.syspath_prepend(str(tmp_path))
    package = tmp_path / "keyed_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "net.py").write_text(KEYED_NET)
    settings, helpers = package / "settings.py", tmp_path / "keyed_helpers.py"
    settings.write_text("SCALE = 2.0\n")
    helpers.write_text("import torch\n\ndef step(x):\n    return torch.relu(x)\n")
    importlib.invalidate_caches()
    net = importlib.import_module("keyed_pkg.net").Net()
    assert "keyed_helpers" not in sys.modules
    first = code_digest(net)
    settings.write_text("SCALE = 3.0\n")  # a constant the module imports by name
    scaled = code_digest(net)
    helpers.write_text("import torch\n\ndef step(x):\n    return torch.tanh(x)\n")
    stepped = code_digest(net)  # a module imported only inside forward
    assert len({first, scaled, stepped}) == 3
    assert "keyed_helpers" not in sys.modules  # found as an import would, nothing of it ran
    settings.write_text("SCALE = 2.0\n")
    helpers.write_text("import torch\n\ndef step(x):\n    return torch.relu(x)\n")
    assert code_digest(net) == first  # the same code again: the same digest


def test_the_code_digest_does_not_depend_on_what_else_the_process_imported(
    tmp_path, monkeypatch, user_modules
):
    """Importing a submodule sets it on its package: a module of the backbone's package that
    the backbone never imports (a race's process imports many) leaves its digest as it was, so
    every job of a race, and the next process, finds the same features."""
    monkeypatch.syspath_prepend(str(tmp_path))
    package = tmp_path / "keyed_house"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "net.py").write_text("from torch import nn\n\n\nclass Net(nn.Linear):\n    pass\n")
    (package / "elsewhere.py").write_text("VALUE = 1\n")
    importlib.invalidate_caches()
    net = importlib.import_module("keyed_house.net").Net(4, 4)
    alone = code_digest(net)
    importlib.import_module("keyed_house.elsewhere")
    assert code_digest(net) == alone


def test_a_submodule_a_package_binds_with_import_module_is_in_the_code_digest(
    tmp_path, monkeypatch, user_modules
):
    """No import statement names a submodule the package loads with ``importlib.import_module``
    into a name of its own: the name it binds leads the digest there, so an edit of it counts."""
    monkeypatch.syspath_prepend(str(tmp_path))
    package = tmp_path / "keyed_loader"
    package.mkdir()
    (package / "__init__.py").write_text(
        'import importlib\n\nhelpers = importlib.import_module(".helpers", __name__)\n'
    )
    helpers = package / "helpers.py"
    helpers.write_text("SCALE = 2.0\n")
    (package / "net.py").write_text(
        "import keyed_loader\nfrom torch import nn\n\n\nclass Net(nn.Linear):\n"
        "    def forward(self, x):\n        return super().forward(x) * keyed_loader.helpers.SCALE\n"
    )
    importlib.invalidate_caches()
    net = importlib.import_module("keyed_loader.net").Net(4, 4)
    first = code_digest(net)
    helpers.write_text("SCALE = 3.0\n")
    assert code_digest(net) != first


def test_a_backbone_whose_code_cannot_be_read_is_not_cached(tmp_path, monkeypatch, capsys):
    namespace: dict = {}
    exec(NET.format(helper="torch", step="relu"), namespace)  # defined in no file
    fileless = type(sys)("fileless_net")
    fileless.Net = namespace["Net"]
    fileless.Net.__module__ = "fileless_net"
    monkeypatch.setitem(sys.modules, "fileless_net", fileless)
    frozen(
        tmp_path / "cache",
        "data=digits_lt",
        model=("model=custom", "model._target_=fileless_net.Net"),
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("features: not cached: the source of fileless_net.Net ")
    assert lines[1].endswith("; not cached)") and not (tmp_path / "cache").exists()


def test_the_same_weights_file_elsewhere_finds_its_features_and_other_weights_do_not(
    tmp_path, capsys
):
    """The weights are keyed by their content: a copy of the file at another path (another
    checkout, a moved download) finds the features its first path computed; a file of other
    weights gets its own."""
    import shutil

    import timm

    torch.manual_seed(0)
    first = tmp_path / "weights.pt"
    torch.save(timm.create_model("resnet18", num_classes=0).state_dict(), first)
    (tmp_path / "moved").mkdir()
    moved = Path(shutil.copy(first, tmp_path / "moved" / "renamed.pt"))
    torch.manual_seed(1)
    other = tmp_path / "other.pt"
    torch.save(timm.create_model("resnet18", num_classes=0).state_dict(), other)
    cache, data = tmp_path / "cache", ("data=digits_lt", "data.n_max=40")
    model = ("model=timm", "model.name=resnet18", "model.image_size=16")

    def features(file: Path) -> tuple:
        return frozen(cache, *data, model=(*model, f"model.weights={file}"))

    a = features(first)
    assert last_line(capsys).startswith("features: computed ")
    b = features(moved)
    assert last_line(capsys).startswith("features: reused ")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    c = features(other)
    assert last_line(capsys).startswith("features: computed ")
    assert not torch.equal(a[0], c[0])
