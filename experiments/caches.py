"""``samplerlab cache list`` and ``samplerlab cache clear``: the folders of
:mod:`runner.cache_dirs` (``$SAMPLERLAB_CACHE``, else the user's cache folder), what each holds
and how much, and their removal. A folder a job is using (it holds one of its lock files) is
not removed: a sweep computing features or a shared prefix would lose them under its feet."""

from __future__ import annotations

import argparse
import fcntl
import shutil
import sys
from pathlib import Path
from typing import Any

from runner import cache_dirs


def add_cache_commands(commands: Any) -> None:
    """``cache list`` and ``cache clear`` under the subcommands ``commands`` (argparse's)."""
    cache = commands.add_parser(
        "cache",
        help="the caches kept between runs: list them, clear them",
        description=f"The caches live under ${cache_dirs.ENV} when it is set, else in the "
        "user's cache folder (~/.cache/samplerlab on Linux). A run's features.cache_dir or "
        "prefixes.cache_dir puts its cache elsewhere; those folders are not listed here.",
    )
    actions = cache.add_subparsers(title="actions", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="each cache: its folder, files and size")
    listing.set_defaults(handler=list_command)
    clear = actions.add_parser("clear", help="remove the caches (computed again when needed)")
    clear.add_argument(
        "kinds",
        nargs="*",
        metavar="KIND",
        help=f"which ({', '.join(cache_dirs.KINDS)}; default: all)",
    )
    clear.set_defaults(handler=clear_command)


def usage(folder: Path) -> tuple[int, int]:
    """The files under ``folder`` and their bytes (0, 0 when it does not exist)."""
    files = [p for p in folder.rglob("*") if p.is_file()] if folder.is_dir() else []
    return len(files), sum(p.stat().st_size for p in files)


def size_text(size: int) -> str:
    """``size`` bytes in decimal units: 512 B, 1.5 MB, 2.0 GB."""
    if size < 1000:
        return f"{size} B"
    units, scaled = ["KB", "MB", "GB"], size / 1000
    while scaled >= 1000 and len(units) > 1:
        scaled /= 1000
        units.pop(0)
    return f"{scaled:.1f} {units[0]}"


def in_use(folder: Path) -> Path | None:
    """A lock file under ``folder`` that a job holds now (see :mod:`runner.locks`), if any."""
    locks = (p for p in folder.rglob("*") if p.name == "lock" or p.name.endswith(".lock"))
    for lock in locks if folder.is_dir() else ():
        with open(lock, "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return lock
    return None


def list_command(args: argparse.Namespace) -> int:
    print(f"samplerlab caches in {cache_dirs.root()}")
    for kind, what in cache_dirs.KINDS.items():
        folder = cache_dirs.folder(kind)
        files, size = usage(folder)
        print(f"  {kind:<9} {size_text(size):>9}  {files:>5} files  {folder}")
        print(f"  {'':<9} {what}")
    return 0


def clear_command(args: argparse.Namespace) -> int:
    unknown = [kind for kind in args.kinds if kind not in cache_dirs.KINDS]
    if unknown:
        print(
            f"samplerlab cache clear: no cache named {unknown[0]!r}; "
            f"the caches: {', '.join(cache_dirs.KINDS)}",
            file=sys.stderr,
        )
        return 2
    kinds = args.kinds or list(cache_dirs.KINDS)
    busy = [lock for kind in kinds if (lock := in_use(cache_dirs.folder(kind))) is not None]
    if busy:
        print(
            f"samplerlab cache clear: a job is using {busy[0]}; clear once it has finished",
            file=sys.stderr,
        )
        return 1
    for kind in kinds:
        folder = cache_dirs.folder(kind)
        files, size = usage(folder)
        shutil.rmtree(folder, ignore_errors=True)
        print(f"removed {folder} ({files} files, {size_text(size)})")
    return 0
