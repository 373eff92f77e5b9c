"""``python -m module args`` run in this test process: the module's code from its arguments on,
as ``-m`` runs it (``runpy``, ``__main__``), without a new interpreter's imports.

Hydra's own plugins test their apps with in-process runners (``hydra.extra.pytest_plugin``);
here the whole command line runs in process, so the arguments go through the same
``hydra.main`` parsing, sweeper and launcher, and the same error reporting, that a user meets.
:func:`run_module` gives the command its working directory, environment, ``sys.argv`` and two
files for stdout and stderr (file descriptors and ``sys`` streams alike), reads the exit status
from ``SystemExit`` (an uncaught exception: its traceback and status 1, as the interpreter
does), and puts back what a command changes in the process it leaves: the working directory,
the environment, the argument list, the streams, logging's handlers and levels, the signal
handlers, Hydra's singletons (the job's HydraConfig among them), torch's thread count and
MLflow's tracking URI and active run.

What it does not give, and what fresh interpreters therefore test (:mod:`tests.helpers.cli`):
start-up itself (a module imported lazily is already here), the status the operating system
reports (a death by signal), signals sent from outside, several commands at once, and
launchers whose jobs are other processes.
"""

from __future__ import annotations

import faulthandler
import io
import logging
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path

import mlflow
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton

from runner import quick_exit


def run_module(
    module: str, args: list[str], cwd: Path, env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m module *args`` in this process, in ``cwd`` with ``env`` over this
    process's environment; its exit status and output as :func:`subprocess.run` returns them.
    A command still running after ``timeout`` seconds ends the test process with every
    thread's traceback (it cannot be stopped from outside as a subprocess can)."""
    folder = Path(tempfile.mkdtemp(prefix="in-process-"))
    out, err = folder / "stdout", folder / "stderr"
    with _restored(), _streams(out, err) as report:
        os.chdir(cwd)
        os.environ.update(env)
        sys.argv = [module, *args]  # runpy puts the module's file first, as -m does
        faulthandler.dump_traceback_later(timeout, exit=True, file=report)
        try:
            status = _status(module)
        finally:
            faulthandler.cancel_dump_traceback_later()
    done = subprocess.CompletedProcess(
        [sys.executable, "-m", module, *args], status, _read(out), _read(err)
    )
    for path in (out, err):
        path.unlink()
    folder.rmdir()
    return done


def _status(module: str) -> int:
    """Run ``module`` as ``__main__``; the exit status a fresh interpreter would give it."""
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as ended:
        return _exit_code(ended.code)
    except BaseException:  # what the interpreter does with an uncaught exception
        traceback.print_exc()
        return -signal.SIGINT if isinstance(sys.exc_info()[1], KeyboardInterrupt) else 1
    return 0


def _exit_code(code: object) -> int:
    """The status ``sys.exit(code)`` gives: 0 for None, the low byte of an int, else 1 with
    the code printed to stderr."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


@contextmanager
def _streams(out: Path, err: Path) -> Iterator[io.TextIOWrapper]:
    """Standard output and error into ``out`` and ``err`` (descriptors 1 and 2, and ``sys``'s
    streams over them, line-buffered as a terminal's); yields the test's own stderr, for what
    must reach it even if the process ends."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    streams = sys.stdout, sys.stderr
    report = open(os.dup(saved[2]), "w")  # noqa: SIM115  # closed below
    try:
        for fd, path in ((1, out), (2, err)):
            with open(path, "wb") as file:
                os.dup2(file.fileno(), fd)
        sys.stdout, sys.stderr = (
            open(fd, "w", buffering=1, closefd=False, errors="backslashreplace")  # noqa: SIM115
            for fd in (1, 2)
        )
        yield report
    finally:
        for stream in (sys.stdout, sys.stderr):
            with suppress(ValueError):
                stream.flush()
        sys.stdout, sys.stderr = streams
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        report.close()


@contextmanager
def _restored() -> Iterator[None]:
    """Put back the process-wide state a command may change."""
    cwd, environ, argv = os.getcwd(), dict(os.environ), list(sys.argv)
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    threads = torch.get_num_threads()
    uri = mlflow.get_tracking_uri() if mlflow.is_tracking_uri_set() else None
    loggers = _logging_state()
    # As Hydra's launchers carry it to their workers; its instances are the live dict, and the
    # job's HydraConfig is set on an instance that may exist already: both are kept apart.
    job_config = HydraConfig.instance().cfg
    hydra = Singleton.get_state()
    hydra = {**hydra, "instances": dict(hydra["instances"])}
    try:
        yield
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environ)
        sys.argv[:] = argv
        for number, handler in handlers.items():
            signal.signal(number, handler)
        torch.set_num_threads(threads)
        while mlflow.active_run() is not None:
            mlflow.end_run()
        if uri is not None:
            mlflow.set_tracking_uri(uri)
        Singleton.set_state(hydra)  # the job's HydraConfig would tell later code it runs in one
        HydraConfig.instance().cfg = job_config
        _restore_logging(loggers)
        quick_exit.forget()  # this process ends as pytest ends it, not with the command's status


LoggerState = tuple[list[logging.Handler], int, bool, bool]


def _logging_state() -> dict[str, LoggerState]:
    """Every logger's handlers, level, propagation and whether it is disabled, by name (the
    root logger as "")."""
    named = logging.Logger.manager.loggerDict.items()
    loggers = {"": logging.getLogger()} | {
        name: logger for name, logger in named if isinstance(logger, logging.Logger)
    }
    return {
        name: (list(logger.handlers), logger.level, logger.propagate, logger.disabled)
        for name, logger in loggers.items()
    }


def _restore_logging(before: dict[str, LoggerState]) -> None:
    """Loggers as they were (Hydra configures logging for each job); the handlers the command
    added are closed (its log files)."""
    after = _logging_state()
    for name, (handlers, _, _, _) in after.items():
        for handler in handlers:
            if handler not in before.get(name, ([], 0, True, False))[0]:
                handler.close()
    for name, (handlers, level, propagate, disabled) in before.items():
        logger = logging.getLogger(name or None)
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate, logger.disabled = propagate, disabled
    for name in after.keys() - before.keys():
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.setLevel(logging.NOTSET)
        logger.propagate, logger.disabled = True, False


def _read(path: Path) -> str:
    return path.read_bytes().decode(errors="replace")
