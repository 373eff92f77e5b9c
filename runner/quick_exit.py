"""The command line's end without the interpreter's teardown.

A Python process ends in three steps: it joins its non-daemon threads, runs the ``atexit``
handlers (MLflow's, multiprocessing's, temporary folders' finalizers), then finalizes the
interpreter, freeing every module's objects one by one. The last step writes nothing a finished
run needs, and with torch, MLflow and scikit-learn loaded it costs 1.5 s of CPU (their imports
alone: 6.1 s to the end of the process against 4.7 s without it); a one-epoch default run took
8.3 s with it, 6.3 s without (four pairs, taken in turns). :func:`command` keeps the first two
steps and skips the third, with the exit status the command reached.

The handler runs last because it is registered before anything the command imports (``atexit``
runs handlers last-in, first-out); the only handler registered before it, logging's, it runs
itself (``logging.shutdown``: every log file flushed and closed).

Example:
    >>> with command():
    ...     pass  # a command that ends normally: its status is 0
    >>> ended_with()
    0
    >>> forget()  # this process ends as Python ends it
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress

_status: list[int] = []  # the command's exit status, once it has one


def _end_now() -> None:
    """At shutdown, after every handler registered later: logging's handlers closed, the
    standard streams flushed, and the process ended with the command's status. Without a status
    (a ``KeyboardInterrupt`` that nothing caught ends by SIGINT), Python ends it as usual."""
    if not _status:
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        # Closed, or a pipe whose reader left: nothing there to keep.
        with suppress(OSError, ValueError):
            stream.flush()
    os._exit(_status[-1])


def _code(stop: SystemExit) -> int:
    """The exit status Python gives ``sys.exit(code)``: an int as it is, None 0, anything else
    (printed to stderr by Python) 1."""
    if stop.code is None:
        return 0
    return stop.code if isinstance(stop.code, int) else 1


@contextmanager
def command() -> Iterator[None]:
    """Around the whole of a command line's work, before its imports: the process ends without
    the interpreter's teardown (see the module), with the status the command reached: 0 when it
    returns, ``sys.exit``'s code, or 1 for an exception nothing caught (whose traceback Python
    prints first)."""
    forget()
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


def ended_with() -> int | None:
    """The status :func:`command` recorded (None: none yet)."""
    return _status[-1] if _status else None


def forget() -> None:
    """Nothing recorded, nothing registered: a command run inside another program (a test)
    leaves that program's end to it."""
    _status.clear()
    atexit.unregister(_end_now)
