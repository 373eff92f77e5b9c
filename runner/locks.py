"""Taking turns between the jobs of a sweep on one machine: a lock file that one job at a time
holds while it computes what the others would compute too (a frozen backbone's features, a
shared training prefix), so that they wait for it and reuse its result instead.

The wait is bounded by progress: a job waits while the holder keeps :func:`beating` (or until
the holder ends, which releases its lock even when it is killed) and gives up after ``wait_s``
seconds without a beat, to compute the thing itself. Results are written atomically, so two
jobs computing at once both leave a whole file.

A holder deletes its lock file before it lets go, so none is left behind. That is safe because
a job counts a lock as held only when the file it locked is still the one at the lock's path:
a job that waited on a file deleted meanwhile gets a lock on nothing and opens the path again,
where it meets the next holder's file. (A lock on a deleted file that counted would let two
jobs hold "the" lock at once.) A job killed while holding leaves its file, which the next
holder deletes in turn."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from runner.errors import UserError

POLL_S = 0.2


@contextmanager
def turn(
    lock: Path,
    wait_s: float,
    setting: str,
    what: str,
    say: Callable[[str], None],
    ready: Callable[[], bool] = lambda: False,
) -> Iterator[bool]:
    """Hold ``lock`` while the block runs; yields whether it is held. Not held: ``ready()``
    turned true while waiting (what this job waits for is there), or another job held it
    without a beat for ``wait_s`` seconds; the block runs anyway. ``setting`` names the config
    key of the folder, for the error when the lock cannot be created there; ``what`` is what
    the holder computes, in the lines ``say`` writes about the wait. The lock file is gone
    once the block ends, if this job held it."""
    handle = _open(lock, setting)
    held, said = False, False
    try:
        while not held:
            if _try_lock(handle):
                if _is_current(handle, lock):
                    held = True
                    break
                handle.close()  # the file was deleted by its last holder: the path again
                handle = _open(lock, setting)
                continue
            if ready():
                break
            idle = time.time() - os.fstat(handle.fileno()).st_mtime
            if idle >= wait_s:
                say(
                    f"{what}: the job computing it made no progress for {idle:.0f} s; computing it here"
                )
                break
            if not said:
                say(f"{what}: another job is computing it; waiting for it")
                said = True
            time.sleep(POLL_S)
        if held:
            beat(lock)
        yield held
    finally:
        if held:  # delete while still holding: a job that locks the file later sees it gone
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()
            fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def _open(lock: Path, setting: str) -> IO[str]:
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        return open(lock, "a")  # noqa: SIM115 (closed by turn; "a" leaves the holder's beat)
    except OSError as error:
        raise UserError(
            f"{setting}: cannot create {lock} ({error.strerror or error})\n"
            f"set {setting}=<a writable folder>"
        ) from None


def _try_lock(handle: IO[str]) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _is_current(handle: IO[str], lock: Path) -> bool:
    """Whether ``handle`` is the file now at ``lock`` (not one its holder deleted)."""
    try:
        now = lock.stat()
    except FileNotFoundError:
        return False
    mine = os.fstat(handle.fileno())
    return (mine.st_dev, mine.st_ino) == (now.st_dev, now.st_ino)


def beat(lock: Path) -> None:
    """The holder of ``lock`` shows progress: a job waiting for it keeps waiting. A job that
    computes without the lock (its holder stalled) beats too; the lock may be gone by then."""
    with contextlib.suppress(FileNotFoundError):
        os.utime(lock)
