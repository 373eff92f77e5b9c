"""Real CLI processes without paying the imports each time: a warm interpreter forks them.

A fresh ``python -m runner`` spends about 5 s of CPU importing torch, torch._dynamo (the first
optimizer imports it), MLflow and its SQL store before it reads its arguments; a suite of a
hundred CLI runs on two cores spends minutes doing only that. :class:`WarmInterpreter` starts
one interpreter per test process (``python -m tests.helpers.warm``) that imports those
dependencies once and never runs anything else. For every command it forks a child, which
becomes the command as ``python -m module args`` would: its own working directory, environment,
arguments, standard streams (files the caller reads) and default signal handlers, then
``runpy.run_module(module, run_name="__main__", alter_sys=True)`` (what ``-m`` does), then the
interpreter's own exit (non-daemon threads joined, ``atexit`` handlers, status). Everything the
command does, from parsing its arguments on, runs in that child: a real process, with its own
pid, exit status and signals. What it shares with a fresh interpreter's run is the state of the
modules after import, which the warm interpreter never changes (it builds no store, no model,
no Hydra config, and runs no torch kernel, so no thread exists to be lost in the fork).

Protocol (JSON lines): the caller writes ``{"id", "module", "args", "cwd", "env", "stdout",
"stderr"}``; the interpreter answers ``{"id", "pid"}`` once the child is forked and
``{"pid", "returncode"}`` when it has reaped it (``-N`` for a death by signal N, as
:mod:`subprocess` reports it).
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


def _become(request: dict[str, Any]) -> int:
    """In the forked child: set up the process as ``python -m`` would, run the module, and
    return its exit status."""
    import runpy

    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a fresh start
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
    sys.path[0] = os.getcwd()  # ``-m`` puts the working directory first
    if os.environ.get("PYTHONUNBUFFERED"):
        sys.stdout.reconfigure(line_buffering=True, write_through=True)
        sys.stderr.reconfigure(line_buffering=True, write_through=True)
    sys.argv = ["-m", *request["args"]]  # runpy replaces argv[0] with the module's file
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        status = 0
    except SystemExit as exit:
        status = _status(exit.code)
    except BaseException:  # what the interpreter does with an uncaught exception
        sys.excepthook(*sys.exc_info())
        status = 1
    threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's own exit: joins threads
    import atexit

    atexit._run_exitfuncs()
    return status


def _status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def serve() -> None:
    """The warm interpreter: fork a child per request, report its pid and, once reaped, its
    exit status; end when the caller closes the requests."""
    import importlib

    for name in WARM:
        importlib.import_module(name)
    requests, replies = os.dup(0), os.dup(1)
    with open(os.devnull, "rb+") as nothing:  # the protocol's pipes are for the protocol alone
        os.dup2(nothing.fileno(), 0)
        os.dup2(nothing.fileno(), 1)
    buffer, open_requests, running = b"", True, set()

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
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    os.close(requests)
                    os.close(replies)
                    status = 1
                    try:
                        status = _become(request)
                    finally:
                        sys.stdout.flush()
                        sys.stderr.flush()
                        os._exit(status)
                running.add(pid)
                reply({"id": request["id"], "pid": pid})
        while running:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            running.discard(pid)
            if open_requests:
                reply({"pid": pid, "returncode": os.waitstatus_to_exitcode(wait_status)})


class WarmProcess:
    """A command the warm interpreter forked, with the part of :class:`subprocess.Popen` that
    tests use: ``pid``, ``returncode``, ``poll``, ``wait``, ``send_signal``, ``kill``."""

    def __init__(self, interpreter: WarmInterpreter, pid: int, args: list[str]) -> None:
        self.interpreter, self.pid, self.args = interpreter, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.interpreter.wait(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.interpreter.wait(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, number: int) -> None:
        if self.poll() is None:  # as Popen: never a signal to a pid that may be reused
            os.kill(self.pid, number)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class WarmInterpreter:
    """The caller's side: one warm interpreter for this process, started on first use."""

    def __init__(self, env: Mapping[str, str], cwd: Path) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.warm"],
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._lock = threading.Condition()
        self._pids: dict[int, int] = {}
        self._exits: dict[int, int] = {}
        self._next = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            message = json.loads(line)
            with self._lock:
                if "returncode" in message:
                    self._exits[message["pid"]] = message["returncode"]
                else:
                    self._pids[message["id"]] = message["pid"]
                self._lock.notify_all()
        with self._lock:  # the interpreter is gone: nobody waits forever
            self._lock.notify_all()

    def _alive(self) -> bool:
        return self._process.poll() is None

    def start(
        self,
        module: str,
        args: list[str],
        cwd: Path,
        env: Mapping[str, str],
        stdout: Path,
        stderr: Path,
    ) -> int:
        """Fork ``python -m module *args`` in ``cwd`` with exactly ``env``, its streams into the
        two files; its pid."""
        with self._lock:
            self._next += 1
            ident = self._next
        request = {
            "id": ident,
            "module": module,
            "args": args,
            "cwd": str(cwd),
            "env": dict(env),
            "stdout": str(stdout),
            "stderr": str(stderr),
        }
        assert self._process.stdin is not None
        with self._lock:
            self._process.stdin.write((json.dumps(request) + "\n").encode())
            self._process.stdin.flush()
            if not self._lock.wait_for(lambda: ident in self._pids or not self._alive(), 60):
                raise RuntimeError("the warm interpreter did not fork within 60 s")
            if ident not in self._pids:
                raise RuntimeError(f"the warm interpreter ended ({self._process.poll()})")
            return self._pids.pop(ident)

    def wait(self, pid: int, timeout: float | None) -> int | None:
        """The exit status of child ``pid``, or None if it is still running after ``timeout``."""
        with self._lock:
            self._lock.wait_for(lambda: pid in self._exits or not self._alive(), timeout)
            if pid not in self._exits and not self._alive():
                raise RuntimeError(f"the warm interpreter ended ({self._process.poll()})")
            return self._exits.pop(pid, None)

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()


if __name__ == "__main__":
    serve()
