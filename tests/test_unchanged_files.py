"""Values computed from files are remembered only while the files stay as they were: within a
process (runner.files.while_unchanged: an image folder's key and a feature bank's rows are read
once per sweep) and, for an image folder's digest, across processes (runner.files.
noted_while_unchanged); read again after any write, a rewrite in place that keeps the names,
sizes and modification times included."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
import torchvision

from runner import files
from runner.data import builtin
from runner.files import while_unchanged
from runner.train.feature_bank import FeatureBank

pytestmark = pytest.mark.unit

# Shorter than runner.files.SETTLED_NS (1 s) to keep the tests quick, still many ticks of the
# coarse clock that stamps files (at most 10 ms on Linux).
SETTLED_S = 0.2


@pytest.fixture(autouse=True)
def quick_settling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "SETTLED_NS", int(SETTLED_S * 1e9))


def settle() -> None:
    time.sleep(SETTLED_S * 1.5)


def write(path: Path, text: str, stamp_ns: int = 1_700_000_000_000_000_000) -> Path:
    """``text`` into ``path``, its access and modification times set to ``stamp_ns``."""
    path.write_text(text)
    os.utime(path, ns=(stamp_ns, stamp_ns))
    return path


class Counting:
    """Reads a file and counts how often it did."""

    def __init__(self, path: Path) -> None:
        self.path, self.calls = path, 0

    def __call__(self) -> str:
        self.calls += 1
        return self.path.read_text()


def test_a_settled_file_is_read_once_and_again_after_a_rewrite_that_keeps_size_and_times(
    tmp_path,
):
    path = write(tmp_path / "a.txt", "one")
    settle()
    read = Counting(path)
    assert while_unchanged(("t",), [str(path)], read) == "one"
    assert while_unchanged(("t",), [str(path)], read) == "one"
    assert read.calls == 1
    before = path.stat()
    write(path, "two")  # the same size and modification time: only the change time differs
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    settle()  # settled again: the change time alone tells
    assert while_unchanged(("t",), [str(path)], read) == "two"
    assert read.calls == 2


def test_a_file_changed_within_the_settling_time_is_never_taken_from_memory(tmp_path):
    path = write(tmp_path / "a.txt", "one")
    read = Counting(path)
    assert while_unchanged(("t",), [str(path)], read) == "one"
    assert while_unchanged(("t",), [str(path)], read) == "one"
    assert read.calls == 2  # written just now: a second write in the same tick could hide


def test_a_file_that_changes_while_computed_is_not_remembered(tmp_path):
    path = write(tmp_path / "a.txt", "one")
    settle()

    def read_then_change() -> str:
        text = path.read_text()
        write(path, "two")
        return text

    assert while_unchanged(("t",), [str(path)], read_then_change) == "one"
    assert files._remembered == {}  # not kept: it is not what the files now give
    settle()
    assert while_unchanged(("t",), [str(path)], path.read_text) == "two"


def test_another_list_of_files_or_another_slot_is_computed_again(tmp_path):
    a, b = write(tmp_path / "a.txt", "a"), write(tmp_path / "b.txt", "b")
    settle()
    assert while_unchanged(("t", "x"), [str(a)], a.read_text) == "a"
    assert while_unchanged(("t", "x"), [str(a), str(b)], lambda: "a+b") == "a+b"
    assert while_unchanged(("t", "y"), [str(a), str(b)], lambda: "y") == "y"
    # One value of each kind: slot x's went when y's came.
    assert while_unchanged(("t", "x"), [str(a), str(b)], lambda: "again") == "again"


def test_a_removed_file_is_computed_again(tmp_path):
    a = write(tmp_path / "a.txt", "a")
    settle()
    assert while_unchanged(("t",), [str(a)], a.read_text) == "a"
    a.unlink()
    assert while_unchanged(("t",), [str(a)], lambda: "gone") == "gone"


def test_an_image_folder_is_read_once_while_unchanged_and_again_after_a_rewrite_in_place(
    tmp_path, monkeypatch
):
    from tests.test_feature_keys import write_folder

    root = tmp_path / "images"
    write_folder(root / "train", 1)
    settle()
    digests = []
    digest = builtin._digest
    monkeypatch.setattr(builtin, "_digest", lambda *a: digests.append(1) or digest(*a))
    notes = tmp_path / "cache"
    first = builtin._folder_key(root, notes)
    assert builtin._folder_key(root, notes) == first
    assert len(digests) == 1
    write_folder(root / "train", 2)  # other pixels; the names, sizes and times kept
    settle()
    second = builtin._folder_key(root, notes)
    assert len(digests) == 2 and second != first
    assert second == digest(*files.listed_while_unchanged(str(root)))  # reading every file


def test_an_image_folder_is_read_once_for_every_process_while_unchanged(tmp_path, monkeypatch):
    """The folder's digest is noted in the cache folder: a process that remembers nothing (its
    memory cleared) reads the note instead of every image; a rewrite in place (the names, sizes
    and modification times kept, the change time moved by the kernel), another decoder version
    and a damaged note are each read again, giving what reading the files gives."""
    from tests.test_feature_keys import write_folder

    root, notes = tmp_path / "images", tmp_path / "cache"
    write_folder(root / "train", 1)
    settle()
    digests = []
    digest = builtin._digest
    monkeypatch.setattr(builtin, "_digest", lambda *a: digests.append(1) or digest(*a))

    def in_a_new_process() -> str:
        files._remembered.clear()
        return builtin._folder_key(root, notes)

    def read() -> str:
        """What reading every file gives (not counted)."""
        return digest(*files.listed_while_unchanged(str(root)))

    first = in_a_new_process()
    assert first == read() and len(digests) == 1
    assert in_a_new_process() == first and len(digests) == 1
    (note,) = notes.glob("image_folder-*.digest")
    assert note.read_text() == first
    write_folder(root / "train", 2)  # other pixels; the names, sizes and times kept
    settle()
    second = in_a_new_process()
    assert second != first and len(digests) == 2
    assert second == read()
    version = torchvision.__version__
    monkeypatch.setattr(torchvision, "__version__", "0.0.0-other")
    assert in_a_new_process() != second  # the decoder's version is part of the digest
    monkeypatch.setattr(torchvision, "__version__", version)
    monkeypatch.setattr(builtin, "DECODED_FORMAT", builtin.DECODED_FORMAT + 1)
    assert in_a_new_process() != second  # and the cache's format
    monkeypatch.setattr(builtin, "DECODED_FORMAT", builtin.DECODED_FORMAT - 1)
    assert in_a_new_process() == second
    for damaged in notes.glob("image_folder-*.digest"):
        damaged.write_text("not a digest")
    count = len(digests)
    assert in_a_new_process() == second and len(digests) == count + 1  # read the files
    assert in_a_new_process() == second and len(digests) == count + 1  # noted again
    image = sorted((root / "train").rglob("*.png"))[0]
    image.rename(image.with_name("renamed.png"))  # the same bytes under another name
    settle()
    assert in_a_new_process() == read() != second


def test_a_digest_of_files_that_change_while_it_is_computed_is_not_noted(tmp_path):
    path = write(tmp_path / "a.txt", "one")
    settle()
    notes = tmp_path / "notes"

    def computed_while_written() -> str:
        write(path, "two")  # the same size and times; the change time moves
        return "ab" * 8

    assert files.noted_while_unchanged(notes, ("t",), [str(path)], computed_while_written)
    assert not notes.exists() or not any(notes.iterdir())
    settle()
    assert files.noted_while_unchanged(notes, ("t",), [str(path)], lambda: "cd" * 8) == "cd" * 8
    assert files.noted_while_unchanged(notes, ("t",), [str(path)], lambda: "ef" * 8) == "cd" * 8


def test_a_decoded_image_folder_is_read_once_and_each_job_gets_data_of_its_own(
    tmp_path, monkeypatch
):
    """The decoded cache and its channel statistics are read once per process while the cache
    file is unchanged; what one job changes in its data is not what the next job gets."""
    from tests.test_feature_keys import write_folder

    root, cache = tmp_path / "images", tmp_path / "decoded"
    for split in ("train", "test"):
        write_folder(root / split, 1)
    builtin.image_folder_lt(str(root), str(cache), imbalance_factor=2)  # decodes, writes
    settle()
    loads, stats_computed = [], []
    load, channel_stats = torch.load, builtin.uint8_channel_stats
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(1) or load(*a, **k))
    monkeypatch.setattr(
        builtin, "uint8_channel_stats", lambda x: stats_computed.append(1) or channel_stats(x)
    )
    first = builtin.image_folder_lt(str(root), str(cache), imbalance_factor=2)
    stats = [list(v) for v in first.normalize]
    expected = (first.train_x.clone(), first.test_x.clone())
    first.train_x.zero_()
    first.test_x.zero_()
    first.normalize[0][0] = first.normalize[1][0] = 9.0
    second = builtin.image_folder_lt(str(root), str(cache), imbalance_factor=2)
    assert len(loads) == len(stats_computed) == 1
    assert torch.equal(second.train_x, expected[0]) and torch.equal(second.test_x, expected[1])
    assert [list(v) for v in second.normalize] == stats
    damaged = next(cache.glob("*.pt"))
    damaged.write_bytes(b"not a tensor file")
    settle()
    third = builtin.image_folder_lt(str(root), str(cache), imbalance_factor=2)  # decoded again
    assert len(loads) == 2 and torch.equal(third.test_x, expected[1])


def test_a_feature_bank_is_read_once_while_its_shards_are_unchanged(tmp_path, monkeypatch):
    folder = tmp_path / "bank"
    said: list[str] = []
    bank = FeatureBank(folder, "key", said.append)
    bank.load()
    one, two = [bytes([i]) * 32 for i in (1, 2)]
    bank.store([one], torch.ones(1, 3))
    settle()
    reads = []
    read = FeatureBank._read
    monkeypatch.setattr(FeatureBank, "_read", lambda self, p: reads.append(p) or read(self, p))
    for _ in range(2):
        again = FeatureBank(folder, "key", said.append)
        again.load()
        assert again.find([one, two])[0] == [0]
    assert len(reads) == 1
    again.store([two], torch.full((1, 3), 2.0))  # a new shard: the folder changed
    later = FeatureBank(folder, "key", said.append)
    later.load()
    found, rows = later.find([one, two])
    assert found == [0, 1] and torch.equal(torch.stack(rows), torch.tensor([[1.0] * 3, [2.0] * 3]))
    assert len(reads) == 3  # both shards read
    assert not said


def test_an_image_folder_behind_a_link_is_keyed_by_the_files_it_links_to(tmp_path):
    """torchvision's ImageFolder decodes the images of a linked folder: the key reads them."""
    from tests.test_feature_keys import write_folder

    first, second = write_folder(tmp_path / "one", 1), write_folder(tmp_path / "two", 2)
    root = tmp_path / "images"
    root.mkdir()
    (root / "train").symlink_to(first, target_is_directory=True)
    before = builtin._folder_key(root, tmp_path / "cache")
    (root / "train").unlink()
    (root / "train").symlink_to(second, target_is_directory=True)
    assert builtin._folder_key(root, tmp_path / "cache") != before


def walked(root: Path) -> list[str]:
    """The files under ``root`` as ``os.walk(followlinks=True)`` finds them, sorted as
    ``sorted(Path)`` sorts them."""
    names = [
        os.path.relpath(os.path.join(folder, name), root)
        for folder, _, found in os.walk(root, followlinks=True)
        for name in found
    ]
    return sorted(names, key=lambda name: Path(name).parts)


def folder(path: Path) -> Path:
    path.mkdir()
    return path


def tree(root: Path) -> Path:
    for name in ("b/2.png", "b/10.png", "a.png", "b/c/d/x.png", "b-c/y.png", "B/z.png"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(name.encode())
    linked = root.parent / f"{root.name}-linked"
    (linked / "deep").mkdir(parents=True)
    (linked / "deep" / "w.png").write_bytes(b"w")
    (root / "link").symlink_to(linked, target_is_directory=True)
    return root


def test_a_folder_is_listed_as_os_walk_finds_it_and_listed_once_while_unchanged(
    tmp_path, monkeypatch
):
    root = tree(tmp_path / "root")
    settle()
    names, paths = files.listed_while_unchanged(str(root))
    assert list(names) == walked(root)
    assert list(paths) == [str(root / name) for name in names]
    scandir = os.scandir
    listed: list[str] = []
    monkeypatch.setattr(os, "scandir", lambda path: listed.append(path) or scandir(path))
    assert files.listed_while_unchanged(str(root)) == (names, paths)
    assert listed == []  # every folder as it was: nothing listed again


@pytest.mark.parametrize(
    "change",
    [
        lambda root: (root / "b" / "c" / "d" / "new.png").write_bytes(b"n"),
        lambda root: (root / "b" / "2.png").unlink(),
        lambda root: (root / "b" / "2.png").rename(root / "b" / "3.png"),
        lambda root: write(folder(root / "b" / "c" / "e") / "n.png", "n"),
        lambda root: (root.parent / "root-linked" / "deep" / "v.png").write_bytes(b"v"),
        lambda root: (root / "link").unlink(),
    ],
    ids=["added", "removed", "renamed", "new folder", "added behind a link", "link removed"],
)
def test_a_folder_is_listed_again_after_an_entry_is_added_removed_or_renamed(tmp_path, change):
    root = tree(tmp_path / "root")
    settle()
    before = files.listed_while_unchanged(str(root))
    change(root)
    settle()
    after = files.listed_while_unchanged(str(root))
    assert list(after[0]) == walked(root) != list(before[0])


def test_a_folder_changed_within_the_settling_time_is_listed_again(tmp_path, monkeypatch):
    root = tree(tmp_path / "root")
    settle()
    files.listed_while_unchanged(str(root))
    (root / "b" / "new.png").write_bytes(b"n")
    # Just written, however long this loaded machine takes to reach the next line.
    monkeypatch.setattr(files, "SETTLED_NS", 3600 * 10**9)
    first = files.listed_while_unchanged(str(root))
    assert "b/new.png" in first[0]
    scandir = os.scandir
    listed: list[str] = []
    monkeypatch.setattr(os, "scandir", lambda path: listed.append(path) or scandir(path))
    assert files.listed_while_unchanged(str(root)) == first
    assert listed  # listed again: a folder that changed just now is not remembered


@pytest.mark.parametrize(
    ("make", "change"),
    [
        (  # a broken link whose target appears as a folder of images
            lambda root, outside: (root / "b" / "more").symlink_to(outside / "extra"),
            lambda root, outside: write(folder(outside / "extra") / "new.png", "n"),
        ),
        (  # a link to an image whose target is replaced by a folder of images
            lambda root, outside: (root / "b" / "t.png").symlink_to(write(outside / "t", "t")),
            lambda root, outside: (
                (outside / "t").unlink(),
                write(folder(outside / "t") / "in.png", "i"),
            ),
        ),
    ],
    ids=["broken link", "link to a file"],
)
def test_a_link_whose_target_becomes_a_folder_is_listed_again(tmp_path, make, change):
    """No folder of the tree changes: the link's target does."""
    root, outside = tree(tmp_path / "root"), folder(tmp_path / "outside")
    make(root, outside)
    settle()
    before = files.listed_while_unchanged(str(root))
    change(root, outside)
    settle()
    after = files.listed_while_unchanged(str(root))
    assert list(after[0]) == walked(root) != list(before[0])


def test_a_loop_of_links_is_a_file_as_os_walk_has_it_and_the_folder_is_listed_whole(tmp_path):
    root = tree(tmp_path / "root")
    (root / "b" / "loop").symlink_to(root / "b" / "loop")
    settle()
    assert list(files.listed_while_unchanged(str(root))[0]) == walked(root)
    assert "b/loop" in walked(root) and "b/2.png" in walked(root)
    assert "folder listing" not in files._remembered  # a link it cannot follow: not remembered
