"""The command line's end without the interpreter's teardown.

A Python process ends in three steps: it joins its non-daemon threads, runs the ``atexit``
handlers (MLflow's, multiprocessing's, temporary folders' finalizers), then finalizes the
interpreter, freeing every module's objects one by one. The last step also flushes files left
open and removes open ``NamedTemporaryFile``s; the runner closes what it opens, so for a finished
run it only costs time: with torch, MLflow and scikit-learn loaded, 1.5 s of CPU (their imports
alone: 6.1 s to the end of the process against 4.7 s without it); a one-epoch default run took
8.3 s with it, 6.3 s without (four pairs, taken in turns). :func:`command` keeps the first two
steps and skips the third, with the exit status the program reached.

The handler runs last because it is registered before anything the program imports (``atexit``
runs handlers last-in, first-out); the only handler registered before it, logging's, it runs
itself (``logging.shutdown``: every log file flushed and closed). Then it writes what waits in
Python's and the C library's output buffers; when that fails (a full disk, a reader gone),
Python's own end reports it.

Example:
    >>> with command():
    ...     pass  # a command that ends normally: its status is 0
    >>> ended_with()
    0
    >>> forget()  # this process ends as Python ends it
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress

_armed: list[bool] = []  # the handler is registered (by the outermost command)
_status: list[int] = []  # the command's exit status, once it has one


def _flushed() -> bool:
    """Every buffer the process's output may wait in, written: Python's standard streams (and
    the originals, if a library replaced them) and the C library's (a C++ or NCCL log line).
    False when one cannot be written (a full disk, a closed pipe): Python's own end reports it."""
    for stream in {
        id(s): s for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    }.values():
        if stream is None or stream.closed:
            continue
        try:
            stream.flush()
        except (OSError, ValueError):
            return False
    with suppress(OSError, AttributeError):  # no C library to load: nothing held there
        ctypes.CDLL(None).fflush(None)
    return True


def _end_now() -> None:
    """At shutdown, after every handler registered later: logging's handlers closed, every
    output buffer written, and the process ended with the command's status. Without a status (a
    ``KeyboardInterrupt`` that nothing caught ends by SIGINT), or when output cannot be written,
    Python ends it as usual."""
    if not _status:
        return
    logging.shutdown()
    if _flushed():
        os._exit(_status[-1])


def _code(stop: SystemExit) -> int:
    """The exit status Python gives ``sys.exit(code)``: an int as it is, None 0, anything else
    (printed to stderr by Python) 1."""
    if stop.code is None:
        return 0
    return stop.code if isinstance(stop.code, int) else 1


@contextmanager
def command() -> Iterator[None]:
    """Around the whole of a program's work, before its imports: the process ends without the
    interpreter's teardown (see the module), with the status the program reached: 0 when it
    returns, ``sys.exit``'s code, or 1 for an exception nothing caught (whose traceback Python
    prints first). Inside another one (``samplerlab run`` runs ``python -m runner``'s program
    in process), it leaves the end to the outer one."""
    if _armed:
        yield
        return
    _armed.append(True)
    atexit.register(_end_now)
    try:
        yield
    except SystemExit as stop:
        _status.append(_code(stop))
        raise
    except KeyboardInterrupt:
        raise
    except BaseException:
        _status.append(1)
        raise
    else:
        _status.append(0)


def armed() -> bool:
    """Whether a :func:`command` will end this process."""
    return bool(_armed)


def ended_with() -> int | None:
    """The status :func:`command` recorded (None: none yet)."""
    return _status[-1] if _status else None


def forget() -> None:
    """Nothing recorded, nothing registered: a program run inside another one (a test, code
    that calls ``samplerlab``'s ``main``) leaves that one's end to it."""
    _armed.clear()
    _status.clear()
    atexit.unregister(_end_now)
