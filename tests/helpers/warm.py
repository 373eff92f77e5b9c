"""Real CLI processes without paying the imports each time: a warm interpreter forks them.

A fresh ``python -m runner`` spends about 5 s of CPU importing torch, torch._dynamo (the first
optimizer imports it), MLflow and its SQL store before it reads its arguments; a suite of a
hundred CLI runs on two cores spends minutes doing only that. :class:`WarmInterpreter` starts
one interpreter per test process (``python -m tests.helpers.warm``) that imports those
dependencies once and runs nothing else. For every command it forks a child, which becomes the
command as ``python -m module args`` would: its own working directory, environment, arguments,
standard streams (files the caller reads) and the signal handlers a fresh interpreter has, then
``runpy.run_module(module, run_name="__main__", alter_sys=True)``, then the interpreter's own
exit (non-daemon threads joined, ``atexit`` handlers, status; an uncaught KeyboardInterrupt dies
by SIGINT). Everything the command does, from parsing its arguments on, runs in that child: a
real process, with its own pid, exit status and signals.

What differs from a fresh interpreter, and so is tested by the fresh runs that remain (see
:mod:`tests.helpers.cli`): the modules imported before the command starts (a missing import in
a lazily imported path would go unseen here), the values read once at start-up or import
(``PYTHONHASHSEED``, ``OMP_*``, ``TMPDIR``'s cached ``tempfile.tempdir`` is reset, numpy's
global generator is reseeded), and the allocator's and BLAS's idle threads, which a fork leaves
behind (the warm interpreter never runs a torch kernel, so none holds work).

Protocol (JSON lines, both ways keyed by the caller's request id): ``{"id", "module", "args",
"cwd", "env", "stdout", "stderr"}`` forks a child, answered by ``{"id", "pid"}``; ``{"id",
"signal"}`` signals that child if it has not been reaped yet; when it is reaped the interpreter
answers ``{"id", "returncode"}`` (``-N`` for a death by signal N, as :mod:`subprocess` says).
The interpreter's own stderr goes to a file whose tail the caller shows if it dies.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# What every CLI run imports anyway, imported once here (not the packages' entry points:
# runner.__main__ and the report's __main__ run in the child, as ``-m`` runs them).
WARM = (
    "torch",
    "torch._dynamo",
    "torch.optim",
    "torchvision",
    "sklearn.metrics",
    "scipy.stats",
    "matplotlib.pyplot",
    "mlflow",
    "mlflow.pytorch",
    "mlflow.store.tracking.sqlalchemy_store",
    "mlflow.store.model_registry.sqlalchemy_store",
    "hydra",
    "runner.app",
    "runner.plots",
    "experiments.report",
    "experiments.race.driver",
)


def _handlers() -> dict[int, Any]:
    """Every signal's handler now: what a fresh interpreter starts the command with."""
    return {number: signal.getsignal(number) for number in signal.valid_signals()}


def _become(request: dict[str, Any], handlers: dict[int, Any]) -> int:
    """In the forked child: set up the process as ``python -m`` would, run the module, and
    return its exit status (a KeyboardInterrupt nobody caught ends it by SIGINT instead)."""
    import atexit  # here: the child's own exit runs the handlers the imports registered
    import runpy
    import tempfile

    for number, handler in handlers.items():
        if handler is not None and number not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(number, handler)
    with open(os.devnull, "rb") as nothing:
        os.dup2(nothing.fileno(), 0)
    with open(request["stdout"], "wb") as stream:
        os.dup2(stream.fileno(), 1)
    if request["stderr"] == request["stdout"]:  # one stream, as stderr=subprocess.STDOUT makes
        os.dup2(1, 2)
    else:
        with open(request["stderr"], "wb") as stream:
            os.dup2(stream.fileno(), 2)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # read again from TMPDIR, as at a fresh start
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()  # a fresh interpreter seeds it from the OS
    sys.path[0] = os.getcwd()  # ``-m`` puts the working directory first
    if os.environ.get("PYTHONUNBUFFERED"):
        sys.stdout.reconfigure(line_buffering=True, write_through=True)
        sys.stderr.reconfigure(line_buffering=True, write_through=True)
    sys.argv = ["-m", *request["args"]]  # runpy replaces argv[0] with the module's file
    interrupted = False
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        status = 0
    except SystemExit as ended:
        status = _status(ended.code)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        status, interrupted = 1, True
    except BaseException:  # what the interpreter does with an uncaught exception
        sys.excepthook(*sys.exc_info())
        status = 1
    threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's exit joins threads
    atexit._run_exitfuncs()
    if interrupted:  # as CPython since 3.8: the parent sees the signal, not a status
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return status


def _status(code: object) -> int:
    """The exit status ``sys.exit(code)`` gives: 0 for None, the low byte of an int, else 1
    with the code printed to stderr."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def serve() -> None:
    """The warm interpreter: fork a child per request, signal it when asked, report its pid
    and, once reaped, its exit status; when the caller closes the requests, kill the children
    still running and end."""
    import importlib

    requests, replies = os.dup(0), os.dup(1)
    with open(os.devnull, "rb+") as nothing:  # the pipes are the protocol's alone: an import
        os.dup2(nothing.fileno(), 0)  # that prints must not write into the replies
        os.dup2(nothing.fileno(), 1)
    handlers = _handlers()
    for name in WARM:
        importlib.import_module(name)
    buffer, open_requests, running = b"", True, {}

    def reply(message: dict[str, Any]) -> None:
        os.write(replies, (json.dumps(message) + "\n").encode())

    while open_requests or running:
        readable, _, _ = select.select([requests] if open_requests else [], [], [], 0.05)
        if readable:
            chunk = os.read(requests, 65536)
            buffer += chunk
            if not chunk:  # the caller is gone: so are the commands it started
                open_requests = False
                for pid in running:
                    os.kill(pid, signal.SIGKILL)
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                request = json.loads(line)
                if "signal" in request:  # only a child not reaped yet: its pid is still its own
                    for pid, ident in running.items():
                        if ident == request["id"]:
                            os.kill(pid, request["signal"])
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    os.close(requests)
                    os.close(replies)
                    status = 1
                    try:
                        status = _become(request, handlers)
                    finally:
                        sys.stdout.flush()
                        sys.stderr.flush()
                        os._exit(status)
                running[pid] = request["id"]
                reply({"id": request["id"], "pid": pid})
        while running:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            ident = running.pop(pid)
            if open_requests:
                reply({"id": ident, "returncode": os.waitstatus_to_exitcode(wait_status)})


class WarmProcess:
    """A command the warm interpreter forked, with the part of :class:`subprocess.Popen` that
    tests use: ``pid``, ``returncode``, ``poll``, ``wait``, ``send_signal``, ``kill``."""

    def __init__(self, interpreter: WarmInterpreter, ident: int, pid: int, args: list[str]):
        self.interpreter, self.ident, self.pid, self.args = interpreter, ident, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit status once the command has ended, else None."""
        if self.returncode is None:
            self.returncode = self.interpreter.wait(self.ident, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit status; :class:`subprocess.TimeoutExpired` after ``timeout`` seconds."""
        if self.returncode is None:
            self.returncode = self.interpreter.wait(self.ident, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, number: int) -> None:
        """Signal the command unless it has ended (the interpreter that reaps it decides)."""
        self.interpreter.signal(self.ident, number)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class WarmInterpreter:
    """The caller's side: a warm interpreter started with ``env`` in ``cwd``, its own stderr
    into ``log``. Safe to use from several threads at once."""

    def __init__(self, env: Mapping[str, str], cwd: Path, log: Path) -> None:
        self.log = log
        with open(log, "wb") as stderr:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "tests.helpers.warm"],
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
        self._lock = threading.Condition()
        self._writing = threading.Lock()
        self._pids: dict[int, int] = {}
        self._exits: dict[int, int] = {}
        self._next = 0
        self.gone = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        try:
            for line in self._process.stdout:
                message = json.loads(line)
                with self._lock:
                    if "returncode" in message:
                        self._exits[message["id"]] = message["returncode"]
                    else:
                        self._pids[message["id"]] = message["pid"]
                    self._lock.notify_all()
        finally:
            with self._lock:  # the interpreter is gone: nobody waits on it any longer
                self.gone = True
                self._lock.notify_all()

    def _send(self, message: dict[str, Any]) -> None:
        assert self._process.stdin is not None
        with self._writing:
            self._process.stdin.write((json.dumps(message) + "\n").encode())
            self._process.stdin.flush()

    def _dead(self) -> RuntimeError:
        tail = self.log.read_bytes()[-3000:].decode(errors="replace")
        return RuntimeError(f"the warm interpreter ended ({self._process.poll()}):\n{tail}")

    def start(
        self,
        module: str,
        args: list[str],
        cwd: Path,
        env: Mapping[str, str],
        stdout: Path,
        stderr: Path,
    ) -> tuple[int, int]:
        """Fork ``python -m module *args`` in ``cwd`` with ``env`` as its whole environment,
        its streams into the two files (one file for both when they are the same path); its
        request id and pid."""
        with self._lock:
            self._next += 1
            ident = self._next
        self._send(
            {
                "id": ident,
                "module": module,
                "args": args,
                "cwd": str(cwd),
                "env": dict(env),
                "stdout": str(stdout),
                "stderr": str(stderr),
            }
        )
        with self._lock:
            if not self._lock.wait_for(lambda: ident in self._pids or self.gone, 60):
                raise RuntimeError("the warm interpreter did not fork within 60 s")
            if ident not in self._pids:
                raise self._dead()
            return ident, self._pids.pop(ident)

    def signal(self, ident: int, number: int) -> None:
        """Send signal ``number`` to command ``ident`` if it has not been reaped yet."""
        if not self.gone:
            self._send({"id": ident, "signal": number})

    def wait(self, ident: int, timeout: float | None) -> int | None:
        """The exit status of command ``ident``, or None if it still runs after ``timeout``."""
        with self._lock:
            self._lock.wait_for(lambda: ident in self._exits or self.gone, timeout)
            if ident not in self._exits and self.gone:
                raise self._dead()
            return self._exits.pop(ident, None)

    def close(self) -> None:
        """End the interpreter, killing the commands it still runs."""
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()


if __name__ == "__main__":
    serve()
