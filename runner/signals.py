"""SIGINT and SIGTERM (Ctrl-C, ``timeout``, ``docker stop``, SLURM, Kubernetes) end a run
cleanly: outside training they raise :class:`Interrupted` at once; inside
:func:`stop_on_signals` with ``deferred=True`` (the training loop) they are held until the loop
reaches a batch boundary and calls :func:`raise_if_stopped`, so a checkpoint is always taken
from a consistent state. A second signal does not wait. Under torchrun the ranks agree at every
batch boundary (:func:`agreeing`), so that all of them stop at the same one."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """A stop requested by a signal; ``exit_code`` follows the shell's 128 + signal number.
    ``safe``: raised at a safe point (:func:`raise_if_stopped`), where the state is consistent
    enough to checkpoint."""

    def __init__(self, signum: int, safe: bool = False) -> None:
        self.signum = signum
        self.signal_name = signal.Signals(signum).name
        self.exit_code = 128 + signum
        self.safe = safe
        super().__init__(f"stopped by {self.signal_name}")

    def __reduce__(self) -> tuple[type[Interrupted], tuple[int, bool]]:
        return type(self), (self.signum, self.safe)


_pending: list[int] = []
_deferring: list[bool] = []
_agreements: list[Callable[[int], int]] = []
_held: list[int] = []
_on_stop: list[Callable[[int], None]] = []


def on_stop(hook: Callable[[int], None]) -> None:
    """Run ``hook(signum)`` once, at the first signal that stops this process, before it
    raises :class:`Interrupted` (a sweep passes the signal on to jobs in other processes and
    waits for them there). A second signal meanwhile stops at once."""
    _on_stop.append(hook)


def _handle(signum: int, frame: object) -> None:
    if _deferring and _deferring[-1] and not _pending:
        _pending.append(signum)
        return
    while _on_stop:
        _on_stop.pop()(signum)
    raise Interrupted(signum)


def raise_if_stopped() -> None:
    """At a safe point: raise :class:`Interrupted` if a signal arrived meanwhile (inside
    :func:`agreeing`: if one arrived at any of the processes that agree)."""
    signum = _pending.pop() if _pending else 0
    if _agreements:
        signum = _agreements[-1](signum)
    if signum:
        raise Interrupted(signum, safe=True)


def stop_if_signalled() -> None:
    """Where no safe point comes for seconds on end (the L-BFGS fits of a post-hoc refit after
    the last epoch): a signal held meanwhile stops at once, as a second signal would, with no
    checkpoint taken there; the run resumes from its last checkpoint. A wait for the next safe
    point would be unbounded (``docker stop`` sends SIGKILL after 10 s). Inside
    :func:`agreeing` (torchrun's ranks) it waits for the safe point, where the ranks vote: one
    rank stopping alone would leave the others waiting on a vote it never casts."""
    if _pending and not _agreements:
        raise Interrupted(_pending.pop())


@contextmanager
def agreeing(agree: Callable[[int], int]) -> Iterator[None]:
    """Inside the block every :func:`raise_if_stopped` passes the signal it holds (0: none) to
    ``agree``, which returns the signal to stop on: the same in every process that calls it at
    the same point (e.g. a vote of torchrun's ranks). So every process must reach the same
    safe points in the same order."""
    _agreements.append(agree)
    try:
        yield
    finally:
        _agreements.pop()


def _hold(signum: int, frame: object) -> None:
    _held.append(signum)


@contextmanager
def held() -> Iterator[None]:
    """Hold SIGINT/SIGTERM while the block runs, e.g. a run's final status write, which a signal
    must not cut short (torchrun sends one to every other rank when a rank fails). A signal
    held is acted on when the block ends: left to an enclosing ``held()`` block, handed to
    :func:`stop_on_signals`' handler where that was in place (it defers or stops), else raised
    as :class:`Interrupted`."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _hold) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if not _held:
        return
    signum = _held[0]
    outer = previous.get(signal.Signals(signum))
    if outer is _hold:  # an enclosing held() block (a run's final writes) raises it at its end
        return
    _held.clear()
    if outer is _handle:  # inside stop_on_signals its handler decides, as it would: defer, or stop
        _handle(signum, None)
        return
    raise Interrupted(signum)


@contextmanager
def stop_on_signals(deferred: bool = False) -> Iterator[None]:
    """Handle SIGINT/SIGTERM inside the block (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _handle) for s in SIGNALS}
    _deferring.append(deferred)
    try:
        yield
    finally:
        _deferring.pop()
        for s, handler in previous.items():
            signal.signal(s, handler)
    raise_if_stopped()  # a signal held until the block's end is not lost
