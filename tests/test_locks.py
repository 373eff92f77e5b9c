"""The lock files jobs take turns with (runner.locks): one holder at a time, and no file left
behind once the holder lets go."""

from __future__ import annotations

import threading
import time

import pytest

from runner.locks import turn

pytestmark = pytest.mark.unit


def test_the_lock_file_is_gone_once_released_and_kept_while_held(tmp_path):
    lock = tmp_path / "deep" / ".x.lock"
    with turn(lock, 60, "s", "x", print) as held:
        assert held and lock.is_file()
    assert not lock.exists() and list(lock.parent.iterdir()) == []


def test_a_file_left_by_a_killed_holder_is_taken_and_deleted(tmp_path):
    lock = tmp_path / "lock"
    lock.write_text("")  # what a job killed while holding leaves (the kernel dropped its lock)
    with turn(lock, 60, "s", "x", print) as held:
        assert held
    assert not lock.exists()


def test_deleting_the_file_never_lets_two_jobs_hold_at_once(tmp_path):
    """Jobs that wait on a file its holder deletes must not count the lock they then get.
    Four jobs take 15 turns each, a job waiting through others' turns most of the time: a
    waiter that kept the deleted file's lock would hold beside the next holder of the new file
    (with the identity check removed, this overlaps within the first turns)."""
    lock, inside, overlaps, held_turns = tmp_path / "lock", [], [], []
    guard = threading.Lock()

    def job() -> None:
        for _ in range(15):
            with turn(lock, 60, "s", "x", lambda _: None) as held:
                assert held
                with guard:
                    inside.append(1)
                    if len(inside) > 1:
                        overlaps.append(len(inside))
                    held_turns.append(1)
                time.sleep(0.01)
                with guard:
                    inside.pop()

    jobs = [threading.Thread(target=job) for _ in range(4)]
    for thread in jobs:
        thread.start()
    for thread in jobs:
        thread.join(120)
    assert len(held_turns) == 60 and overlaps == []
    assert not lock.exists()
