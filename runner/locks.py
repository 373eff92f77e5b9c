"""Taking turns between the jobs of a sweep on one machine: a lock file that one job at a time
holds while it computes what the others would compute too (a frozen backbone's features, a
shared training prefix), so that they wait for it and reuse its result instead.

The wait is bounded by progress: a job waits while the holder keeps :func:`beating` (or until
the holder ends, which releases its lock even when it is killed) and gives up after ``wait_s``
seconds without a beat, to compute the thing itself. Results are written atomically, so two
jobs computing at once both leave a whole file."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

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
    the holder computes, in the lines ``say`` writes about the wait."""
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        handle = open(lock, "a")  # noqa: SIM115 (closed below; "a" leaves the holder's beat)
    except OSError as error:
        raise UserError(
            f"{setting}: cannot create {lock} ({error.strerror or error})\n"
            f"set {setting}=<a writable folder>"
        ) from None
    with handle:
        held, said = False, False
        while not held:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
            except BlockingIOError:
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
        try:
            yield held
        finally:
            if held:
                fcntl.flock(handle, fcntl.LOCK_UN)


def beat(lock: Path) -> None:
    """The holder of ``lock`` shows progress: a job waiting for it keeps waiting."""
    os.utime(lock)
