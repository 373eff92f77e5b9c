"""The feature bank holds features per input row: every cut of the same images reuses them, a
changed image is computed again, and extraction keeps its large allocations between batches
without changing a number."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from runner.build import build, build_model, freeze
from runner.data import LongTailData
from runner.train.features import extract
from runner.train.feed import Feed, place
from runner.train.heap import glibc
from tests.conftest import compose_config

pytestmark = pytest.mark.unit

CPU = torch.device("cpu")
SMALL_CNN = ("model=small_cnn", "model.width=8")


def frozen_run(
    cache: Path, *overrides: str, engine: str | None = None
) -> tuple[LongTailData, LongTailData]:
    """The data of ``overrides`` (digits) and the features ``freeze`` makes of it, with
    ``features.engine=engine`` when given."""
    cfg = compose_config(
        [
            "data=digits_lt",
            *SMALL_CNN,
            "model.freeze=true",
            "trainer.augment=false",
            f"features.cache_dir={cache}",
            *overrides,
        ]
    )
    if engine is not None:  # the schema's typed node takes no key it lacks: a plain copy does
        cfg = OmegaConf.create(OmegaConf.to_container(cfg))
        cfg.features.engine = engine
    data = place(build("data", cfg.data), CPU)
    torch.manual_seed(0)
    net = build_model(cfg.model, data.in_shape, data.num_classes)
    return data, freeze(net, data, cfg, CPU)[1]


def test_another_cut_of_the_same_images_computes_no_features(tmp_path, capsys):
    """digits without a tail (IF 1) cut with data seeds 0 and 1, and with a validation split
    of 10 a class, hold nearly every image; other imbalance factors, validation sizes and data
    seeds cut the same images otherwise and compute none."""
    for prime in ((), ("data.data_seed=1",), ("data.val_per_class=10",)):
        frozen_run(tmp_path, "data.imbalance_factor=1", *prime)
        assert capsys.readouterr().out.startswith("features: computed ")
    cuts = [
        ("data.imbalance_factor=10",),
        ("data.imbalance_factor=50", "data.val_per_class=3"),
        ("data.data_seed=1", "data.imbalance_factor=20"),
        ("data.imbalance_factor=100", "data.val_per_class=5"),
    ]
    for cut in cuts:
        data, featured = frozen_run(tmp_path, *cut)
        rows = sum(len(x) for x in (data.train_x, data.val_x, data.test_x) if x is not None)
        line = capsys.readouterr().out.strip()
        assert line.startswith(f"features: reused {rows} rows (of {rows}; "), (cut, line)
        assert featured.val_x is not None or "data.val_per_class" not in str(cut)
    # The reused rows are what computing this cut afresh gives (SmallCNN in eval mode: a row's
    # features do not depend on the other rows of its batch, bit for bit on this CPU path).
    _, fresh = frozen_run(tmp_path / "fresh", *cuts[3])
    assert torch.equal(featured.train_x, fresh.train_x)
    assert torch.equal(featured.val_x, fresh.val_x) and torch.equal(featured.test_x, fresh.test_x)


def test_a_changed_image_alone_is_computed_again(tmp_path, capsys):
    cfg = compose_config(
        ["data=digits_lt", *SMALL_CNN, "model.freeze=true", "trainer.augment=false"]
        + [f"features.cache_dir={tmp_path}"]
    )
    data = place(build("data", cfg.data), CPU)
    torch.manual_seed(0)
    net = build_model(cfg.model, data.in_shape, data.num_classes)
    before = freeze(net, data, cfg, CPU)[1]
    data.train_x[3] = data.train_x[3].flip(-1)  # one image mirrored, the rest as they were
    capsys.readouterr()
    after = freeze(net, data, cfg, CPU)[1]
    total = len(data.train_x) + len(data.test_x)
    line = capsys.readouterr().out.strip()
    assert line.startswith("features: computed 1 x 32 from SmallCNN in "), line
    assert f"; reused {total - 1} rows (of {total}; " in line
    assert not torch.equal(after.train_x[3], before.train_x[3])
    others = torch.ones(len(data.train_x), dtype=torch.bool)
    others[3] = False
    assert torch.equal(after.train_x[others], before.train_x[others])


def test_rows_of_the_same_content_are_digested_once_per_process(monkeypatch):
    """A sweep's jobs feed equal splits held in other tensors: their row digests are computed
    once; a changed byte, another standardisation, dtype or shape computes them, and the
    remembered digests are those a computation gives."""
    from runner.train import features

    x = torch.randint(0, 256, (40, 3, 4, 4), dtype=torch.uint8)
    stats = ([0.5, 0.4, 0.3], [0.2, 0.2, 0.25])
    converted = []
    batches = Feed.batches
    monkeypatch.setattr(Feed, "batches", lambda self, *a: converted.append(1) or batches(self, *a))
    first = features.feed_digests(Feed(x, CPU, stats))
    assert features.feed_digests(Feed(x.clone(), CPU, stats)) == first
    assert len(converted) == 1
    changed = x.clone()
    changed[7, 0, 0, 0] ^= 1
    again = features.feed_digests(Feed(changed, CPU, stats))
    assert [i for i in range(40) if again[i] != first[i]] == [7]
    other = features.feed_digests(Feed(x.clone(), CPU, (stats[0], [0.3, 0.2, 0.25])))
    assert all(a != b for a, b in zip(other, first, strict=True))
    assert len(converted) == 3
    # The same bytes as another dtype or shape, unstandardised, or the standardisation's
    # values split otherwise between mean and std: other rows, other digests.
    for feed in (
        Feed(x.view(torch.int8), CPU, stats),
        Feed(x.view(40, 3, 16, 1), CPU, stats),
        Feed(x, CPU, None),
    ):
        assert features.feed_digests(feed) != first
    per_channel_std = features.feed_digests(Feed(x, CPU, ([0.5], [0.4, 0.3, 0.2])))
    per_channel_mean = features.feed_digests(Feed(x, CPU, ([0.5, 0.4, 0.3], [0.2])))
    assert per_channel_std != per_channel_mean
    assert len(converted) == 8
    features._FED.clear()
    assert features.feed_digests(Feed(x, CPU, stats)) == first  # what computing them gives


def test_a_shard_of_the_wrong_shape_is_computed_again(tmp_path, capsys):
    _, first = frozen_run(tmp_path)
    for shard in tmp_path.glob("*/shard-*.pt"):
        entry = torch.load(shard, weights_only=True)
        entry["features"] = entry["features"][:-1]  # a row short of its digests
        torch.save(entry, shard)
    capsys.readouterr()
    _, again = frozen_run(tmp_path)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and all(
        "does not hold one feature row per digest; its rows are computed again" in line
        for line in lines[:2]
    )
    assert lines[2].startswith("features: computed ")
    assert torch.equal(again.train_x, first.train_x)


FAULTS = """
import resource, torch
from runner.train.heap import kept_heap

def faults():
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(30):
        torch.ones(16 * 2**20)  # 64 MiB of float32, every page written
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start

mapped = faults()
with kept_heap() as kept:
    reused = faults()
print(kept, mapped, reused)
"""


@pytest.mark.skipif(glibc() is None, reason="kept_heap changes glibc's malloc only")
def test_large_allocations_kept_between_batches_fault_far_less():
    """Thirty 64 MiB buffers allocated, touched and freed in turn (as an extraction's batches
    do with their activations): glibc maps each afresh, 16,384 pages faulted in each time,
    unless the heap is kept, when only the first few are (until the heap has grown to fit
    them; 5 to 8 of the 30 in six runs here). Half as many faults is the bound: about
    twice the most seen. In a process of its own: libraries a test loaded before (their
    threads' arenas, mappings above the heap) change where glibc finds room."""
    done = subprocess.run(
        [sys.executable, "-c", FAULTS], capture_output=True, text=True, check=True, timeout=120
    )
    kept, mapped, reused = done.stdout.split()
    assert kept == "True" and int(mapped) > 30 * 16_384 * 0.9
    assert int(reused) < int(mapped) / 2, (reused, mapped)


def test_keeping_the_heap_changes_no_feature():
    """Extraction with the heap kept (the default) and without: the same features, bit for bit."""
    torch.manual_seed(0)
    backbone = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1)
    ).eval()
    images = torch.rand(300, 3, 48, 48)  # two batches, activations above 32 MiB each
    kept, digests = extract(backbone, Feed(images, CPU))
    plain, again = extract(backbone, Feed(images, CPU), keep_heap=False)
    assert torch.equal(kept, plain) and digests == again and kept.shape == (300, 64, 1, 1)
