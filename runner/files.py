"""Files a reader finds whole or not at all (checkpoints, cached features, decoded images), and
values computed from files, remembered while the files stay as they were."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# A file changed less than this long ago is not remembered: Linux stamps a write's times from a
# coarse clock (milliseconds apart), so a second write within the tick of the first can leave
# the file's size and times as they were. It assumes times finer than this and a stat that sees
# every write (not so for FAT's 2 s, or a network file system's cached attributes of a file
# another machine rewrites).
SETTLED_NS = 1_000_000_000
# kind (a slot's first part) -> (the slot, its paths, their states, the value computed from
# them): one value of each kind, so that a sweep over many backbones holds one bank's rows.
_Held = tuple[tuple[str, ...], tuple[str, ...], tuple[tuple[int, ...], ...], Any]
_remembered: dict[str, _Held] = {}
# What a note of noted_while_unchanged holds: anything else is computed again.
_DIGEST = re.compile(r"[0-9a-f]{16,64}")


def write_atomically(path: Path, data: bytes | memoryview) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it (fsync, then rename), so
    that a kill never leaves half a file. An ``OSError`` (a full disk, a file-size limit, no
    permission) removes the temporary file, leaves any earlier ``path`` as it was, and is raised
    for the caller to explain.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> write_atomically(folder / "sub" / "a.bin", b"abc")
        >>> (folder / "sub" / "a.bin").read_bytes(), sorted(p.name for p in (folder / "sub").iterdir())
        (b'abc', ['a.bin'])
    """
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise


def file_states(paths: Sequence[str]) -> tuple[tuple[int, ...], ...] | None:
    """Each file's device, inode, size, and modification and change times (nanoseconds): a
    write, a replacement or a restored modification time changes one of them (the kernel sets
    the change time itself). None when a file cannot be read or changed within the last
    :data:`SETTLED_NS`."""
    settled = time.time_ns() - SETTLED_NS
    states = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            return None
        if max(st.st_ctime_ns, st.st_mtime_ns) > settled:
            return None
        states.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(states)


def while_unchanged(slot: tuple[str, ...], paths: Sequence[str], compute: Callable[[], T]) -> T:
    """``compute()``, a value of the files ``paths`` alone; or, without computing, the value it
    gave for ``slot`` last time in this process, when ``paths`` and every file's state
    (:func:`file_states`) are as they were then. A value is remembered only if no file changed
    while it was computed, and only the latest of its kind (``slot[0]``): the caller must not
    change it.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "a.txt"
        >>> _ = path.write_text("one")
        >>> time.sleep(SETTLED_NS / 1e9 + 0.1)  # a file written just now is not remembered
        >>> while_unchanged(("example",), [str(path)], path.read_text)
        'one'
        >>> while_unchanged(("example",), [str(path)], lambda: "not computed again")
        'one'
        >>> _ = path.write_text("two")  # changed: computed again
        >>> while_unchanged(("example",), [str(path)], path.read_text)
        'two'
    """
    names = tuple(paths)
    before = file_states(names)
    held = _remembered.get(slot[0])
    if before is not None and held is not None and held[:3] == (slot, names, before):
        return held[3]
    _remembered.pop(slot[0], None)  # its memory goes before another value is computed
    value = compute()
    if before is not None and file_states(names) == before:
        _remembered[slot[0]] = (slot, names, before, value)
    return value


def noted_while_unchanged(
    folder: Path, slot: tuple[str, ...], paths: Sequence[str], compute: Callable[[], str]
) -> str:
    """``compute()``, a digest (16 to 64 hex digits) of the files ``paths`` and what ``slot``
    names (its kind first, a file name's part, then what else the digest depends on, such as
    a decoder's version); or, without computing, the digest it gave in any process, noted in
    ``folder`` under a name derived from ``slot``, ``paths`` and every file's state
    (:func:`file_states`), when they are all as they were then. A write to a file moves its
    change time, which no tool sets back (the kernel stamps it), so a file rewritten in place
    with its name, size and modification time kept is computed again: on a file system that
    keeps a change time and stable inode numbers (not FAT or exFAT, whose change time is the
    creation or modification time and whose inodes are numbered anew at each mount; the
    same limits as :data:`SETTLED_NS`'s). A note is written only when no file changed while it
    was computed; an unreadable or malformed note is computed again; a folder that cannot be
    written leaves nothing noted.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> path = folder / "a.txt"
        >>> _ = path.write_text("one")
        >>> time.sleep(SETTLED_NS / 1e9 + 0.1)  # a file written just now is not noted
        >>> notes = folder / "notes"
        >>> noted_while_unchanged(notes, ("example", "v1"), [str(path)], lambda: "ab12" * 4)
        'ab12ab12ab12ab12'
        >>> noted_while_unchanged(notes, ("example", "v1"), [str(path)], lambda: "0" * 16)
        'ab12ab12ab12ab12'
        >>> noted_while_unchanged(notes, ("example", "v2"), [str(path)], lambda: "0" * 16)
        '0000000000000000'
    """
    before = file_states(paths)
    if before is None:
        return compute()
    name = hashlib.sha256(repr((slot, tuple(paths), before)).encode()).hexdigest()[:32]
    note = folder / f"{slot[0]}-{name}.digest"
    try:
        noted = note.read_text()
        if _DIGEST.fullmatch(noted):
            return noted
    except (OSError, UnicodeDecodeError):
        pass
    value = compute()
    if _DIGEST.fullmatch(value) and file_states(paths) == before:
        # A folder that cannot be written (the decoded cache says so): computed again next time.
        with contextlib.suppress(OSError):
            write_atomically(note, value.encode())
    return value


def listed_while_unchanged(root: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Every file under the folder ``root``, walked into linked folders as
    ``os.walk(root, followlinks=True)`` walks: their names relative to ``root``, sorted by path
    components (the order ``sorted(Path)`` gives), and their paths. Taken from the last walk of
    ``root`` in this process while every folder's and every link's state (:func:`file_states`;
    a link's is its target's) is as it was then: the kernel moves a folder's change time when an
    entry is added to, removed from or renamed in it, and a link's target that becomes a folder
    is another file. Each state is read before its folder is listed or its link classified, so
    that a change meanwhile is seen at the next call. A walk that met a broken link, a folder it
    could not list or an entry it could not classify is not remembered. One folder's listing is
    held.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> (root / "b").mkdir()
        >>> for name in ("b/x.png", "a.png"):
        ...     _ = (root / name).write_bytes(b"")
        >>> listed_while_unchanged(str(root))[0]
        ('a.png', 'b/x.png')
    """
    slot = ("folder listing", root)
    held = _remembered.get(slot[0])
    if held is not None and held[0] == slot and file_states(held[1]) == held[2]:
        listing: tuple[tuple[str, ...], tuple[str, ...]] = held[3]
        return listing
    _remembered.pop(slot[0], None)
    watched: list[str] = []
    states: list[tuple[int, ...]] = []
    settled = True  # every folder and link read, none changed within the settling time

    def watch(path: str) -> None:
        nonlocal settled
        state = file_states([path])
        if state is None:
            settled = False
        else:
            watched.append(path)
            states.append(state[0])

    names: list[str] = []
    pending = [""]
    while pending:
        relative = pending.pop()
        folder = os.path.join(root, relative) if relative else root
        watch(folder)
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    name = os.path.join(relative, entry.name) if relative else entry.name
                    try:
                        if entry.is_symlink():  # its target can change while no folder does
                            watch(entry.path)
                        is_folder = entry.is_dir()
                    except OSError:  # as os.walk: not a folder (a loop of links, say)
                        is_folder, settled = False, False
                    (pending if is_folder else names).append(name)
        except OSError:  # as os.walk: a folder that cannot be listed is left out
            settled = False
    names.sort(key=lambda name: name.split(os.sep))
    listing = tuple(names), tuple(os.path.join(root, name) for name in names)
    if settled:
        _remembered[slot[0]] = (slot, tuple(watched), tuple(states), listing)
    return listing
