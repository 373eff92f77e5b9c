"""The drawing pool: independent, separately seeded chunks of random work on a few threads.

Results do not depend on the number of threads: each chunk has its own generator, and sums or
tables built on a pool thread run with torch single-threaded there.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TypeVar

import torch

from samplers._seeding import generator_for

__all__ = [
    "CHUNK",
    "chunks",
    "in_background",
    "in_chunks",
    "on_pool_thread",
    "over_chunks",
    "run_tasks",
]

T = TypeVar("T")

#: Random work runs in chunks of this many items, each from its own generator, so the result
#: does not depend on how many threads produced it (and chunks stay in cache).
CHUNK = 1 << 16
_pool: ThreadPoolExecutor | None = None
_in_worker = threading.local()


def _forget_pool() -> None:
    """A forked child inherits the pool object but not its threads: start a fresh one there."""
    global _pool
    _pool = None


os.register_at_fork(after_in_child=_forget_pool)


def _start_worker(threads: int) -> None:
    """Pool threads run torch on one thread each: the pool's chunks are the parallelism, and a
    small draw never waits on intra-op threads that a loaded machine has descheduled."""
    torch.get_num_threads()  # torch's lazy per-thread setup first, so that it cannot undo this
    torch.set_num_threads(1)  # per thread under OpenMP, but it also sets torch's default for new
    # threads; a short-lived thread puts that default back, so user threads are unaffected.
    restore = threading.Thread(target=torch.set_num_threads, args=(threads,))
    restore.start()
    restore.join()
    _in_worker.active = True


def _started_pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        threads = torch.get_num_threads()
        _pool = ThreadPoolExecutor(
            max_workers=max(1, min(threads, 8)), initializer=_start_worker, initargs=(threads,)
        )
    return _pool


def run_tasks(tasks: Sequence[Callable[[], object]]) -> None:
    """Run independent ``tasks`` (each seeded on its own) on the drawing pool.

    Inside a pool thread (a part drawn in the background, say) the tasks go to the pool too,
    but that thread runs every one of them that no other thread has started yet: it waits
    only on tasks already running elsewhere, deeper in the same work, which never wait on it,
    so nested waits cannot deadlock even when every thread waits.
    """
    in_worker = getattr(_in_worker, "active", False)
    if in_worker and len(tasks) == 1:
        tasks[0]()
        return
    pool = _started_pool()
    futures = [pool.submit(task) for task in tasks]
    if in_worker:
        # Take every task that no other thread has started before waiting on any: a thread
        # that waits first finds the next task taken whenever it wakes up.
        started = []
        for future, task in zip(futures, tasks, strict=True):
            if future.cancel():
                task()
            else:
                started.append(future)
        futures = started
    for future in futures:
        future.result()  # torch releases the GIL inside its kernels; errors surface here


def in_background(fn: Callable[[], T]) -> Callable[[], T]:
    """Start ``fn()`` on a pool thread and return a function that waits for its result (and
    raises its error), so that the caller can meanwhile hand the pool other work.

    Inside a pool thread ``fn()`` runs at once: that thread would only wait for it.
    """
    if getattr(_in_worker, "active", False):
        result = fn()
        return lambda: result
    return _started_pool().submit(fn).result


def on_pool_thread(fn: Callable[[], T]) -> T:
    """``fn()`` computed on a pool thread, where torch runs single-threaded: sums and tables
    built there do not depend on the thread count (a parallel sum rounds differently)."""
    result: list[T] = []
    run_tasks([lambda: result.append(fn())])
    return result[0]


def chunks(count: int) -> range:
    """The numbers of the ``CHUNK``-sized chunks that ``count`` items fill."""
    return range(-(-count // CHUNK))


def in_chunks(
    count: int, seed: int, produce: Callable[[int, torch.Generator], torch.Tensor]
) -> torch.Tensor:
    """``produce(size, generator)`` for each chunk of ``count``, on the drawing pool."""
    out = torch.empty(count, dtype=torch.long)

    def fill(chunk: int) -> None:
        start = chunk * CHUNK
        size = min(CHUNK, count - start)
        out[start : start + size] = produce(size, generator_for(seed, chunk))

    run_tasks([partial(fill, chunk) for chunk in chunks(count)])
    return out


def over_chunks(count: int, fn: Callable[[slice], T]) -> list[T]:
    """``fn(part)`` for the slice of each ``CHUNK``-sized chunk of ``count`` items, on the
    drawing pool; the results in chunk order."""
    results: dict[int, T] = {}

    def run(chunk: int) -> None:
        results[chunk] = fn(slice(chunk * CHUNK, (chunk + 1) * CHUNK))

    run_tasks([partial(run, chunk) for chunk in chunks(count)])
    return [results[chunk] for chunk in chunks(count)]
