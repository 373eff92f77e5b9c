"""The project's command lines run as a user runs them, in real subprocesses: to completion
(:func:`run_cli`; any module with :func:`run_python`) or started in the background for signal tests
(:func:`start_cli`, :func:`wait_for`). A run that ends otherwise than expected fails the test
with its command line, exit status and the ends of its output in one message.

``python -m module ...`` run to completion is forked from a warm interpreter
(:mod:`tests.helpers.warm`): the same process from its arguments on, without the 5 s of imports.
So are the background runs of :func:`start_cli`. Commands with a ``preexec_fn``, other
interpreter arguments or ``fresh=True`` start a fresh interpreter: the tests of start-up itself
(the default run, ``--cfg``, plugin discovery, torchrun's ranks) and the CLI helper's own
parity tests use one."""

from __future__ import annotations

import atexit
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from tests.helpers.warm import WarmInterpreter, WarmProcess

ROOT = Path(__file__).resolve().parents[2]
TAIL = 3000  # characters of each stream a failure shows


def environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with ``extra`` over it, and this checkout first on the path,
    so that the code (and the Hydra plugins) under test are this checkout's, whatever the
    subprocess's working directory."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, **(extra or {}), "PYTHONPATH": path}


def runner_args(
    overrides: tuple[str, ...], uri: str | None = None, multirun: bool = False
) -> list[str]:
    """The arguments of ``python -m runner`` with ``overrides``: ``-m`` first for a multirun,
    and ``tracking.uri=uri`` last when a store is given. A multirun keeps its shared prefixes
    in the test's working folder unless told otherwise: a sweep that fails keeps them (for
    ``resume=``), and the default folder is the user cache (each test's own SAMPLERLAB_CACHE)."""
    cache = multirun and not any(o.startswith("prefixes.cache_dir=") for o in overrides)
    return [
        "-m",
        "runner",
        *(["-m"] if multirun else []),
        *overrides,
        *(["prefixes.cache_dir=prefix-cache"] if cache else []),
        *([f"tracking.uri={uri}"] if uri is not None else []),
    ]


def _text(output: str | bytes | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def _report(command: list[str], status: str, stdout: str, stderr: str) -> str:
    return (
        f"{shlex.join(command)}\n{status}\n"
        f"--- stdout (last {TAIL} characters) ---\n{stdout[-TAIL:]}\n"
        f"--- stderr (last {TAIL} characters) ---\n{stderr[-TAIL:]}"
    )


def run_python(
    *args: str,
    cwd: Path,
    timeout: float = 300,
    expect: int | None = 0,
    env: Mapping[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
    fresh: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``python *args`` (this interpreter) in ``cwd`` to its end, its output captured as
    text, for at most ``timeout`` seconds; ``env`` adds variables to this process's environment.
    The test fails (with the command, its status and the tails of stdout and stderr) when the
    exit status is not ``expect`` (``None``: any status is returned) or the time runs out.
    ``python -m`` commands are forked from the warm interpreter unless ``fresh`` (or a
    ``preexec_fn``) asks for a new interpreter."""
    command = [sys.executable, *args]
    if args[:1] == ("-m",) and len(args) > 1 and preexec_fn is None and not fresh:
        done = _run_warm(command, cwd, timeout, environment(env))
    else:
        done = _run_fresh(command, cwd, timeout, environment(env), preexec_fn)
    return _expected(done, expect)


def run_command(
    command: list[str], cwd: Path, env: Mapping[str, str], timeout: float = 300, expect: int = 0
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in ``cwd`` with exactly the environment ``env`` (not this checkout's
    path: an installed program as a user runs it) to its end; the test fails as for
    :func:`run_python` when its exit status is not ``expect`` or the time runs out."""
    return _expected(_run_fresh(command, cwd, timeout, dict(env), None), expect)


def _expected(
    done: subprocess.CompletedProcess[str], expect: int | None
) -> subprocess.CompletedProcess[str]:
    """``done``, or the test fails with its command, status and output tails."""
    if expect is not None and done.returncode != expect:
        pytest.fail(
            _report(
                [str(part) for part in done.args],
                f"exit status {done.returncode}, expected {expect}",
                done.stdout,
                done.stderr,
            ),
            pytrace=False,
        )
    return done


def _run_fresh(
    command: list[str],
    cwd: Path,
    timeout: float,
    env: dict[str, str],
    preexec_fn: Callable[[], None] | None,
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            command,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            preexec_fn=preexec_fn,
        )
    except subprocess.TimeoutExpired as late:
        pytest.fail(
            _report(
                command, f"still running after {timeout} s", _text(late.stdout), _text(late.stderr)
            ),
            pytrace=False,
        )


_warm: list[WarmInterpreter] = []  # this process's warm interpreter, once started
_starting = threading.Lock()


def _interpreter() -> WarmInterpreter:
    """This process's warm interpreter, started on first use and again if it died."""
    with _starting:
        if not _warm or _warm[0].gone:
            log = Path(tempfile.mkdtemp(prefix="warm-")) / "stderr"
            _warm[:] = [WarmInterpreter(environment(), ROOT, log)]
            atexit.register(_warm[0].close)
        return _warm[0]


def _run_warm(
    command: list[str], cwd: Path, timeout: float, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """``command`` (``python -m module ...``) forked from the warm interpreter, to its end or
    ``timeout`` (then killed, and the test fails with what it printed)."""
    folder = Path(tempfile.mkdtemp(prefix="cli-"))
    out, err = folder / "stdout", folder / "stderr"
    interpreter = _interpreter()
    try:
        ident, _ = interpreter.start(command[2], command[3:], cwd, env, out, err)
        returncode = interpreter.wait(ident, timeout)
        if returncode is None:
            interpreter.signal(ident, signal.SIGKILL)
            interpreter.wait(ident, 30)
            pytest.fail(
                _report(command, f"still running after {timeout} s", _read(out), _read(err)),
                pytrace=False,
            )
        return subprocess.CompletedProcess(command, returncode, _read(out), _read(err))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _read(path: Path) -> str:
    return path.read_bytes().decode(errors="replace") if path.exists() else ""


def run_cli(
    *overrides: str,
    cwd: Path,
    uri: str | None = None,
    multirun: bool = False,
    timeout: float = 300,
    expect: int | None = 0,
    env: Mapping[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
    fresh: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``python -m runner [-m] *overrides [tracking.uri=uri]`` through :func:`run_python`:
    by default it must exit 0 within 300 s."""
    return run_python(
        *runner_args(overrides, uri, multirun),
        cwd=cwd,
        timeout=timeout,
        expect=expect,
        env=env,
        preexec_fn=preexec_fn,
        fresh=fresh,
    )


def start_cli(
    *overrides: str, cwd: Path, log: Path, uri: str | None = None, multirun: bool = False
) -> WarmProcess:
    """``python -m runner`` started in the background (forked from the warm interpreter),
    stdout and stderr unbuffered into ``log``, for a test to signal; the test waits for it
    (``process.wait(timeout=...)``)."""
    args = runner_args(overrides, uri, multirun)
    env = environment({"PYTHONUNBUFFERED": "1"})
    log.write_bytes(b"")  # there before the child opens it: the test may read it at once
    interpreter = _interpreter()
    ident, pid = interpreter.start(args[1], args[2:], cwd, env, log, log)
    return WarmProcess(interpreter, ident, pid, [sys.executable, *args])


def wait_for(
    log: Path, text: str, process: WarmProcess, after: str = "", timeout: float = 240
) -> None:
    """Until ``text`` appears in ``log`` (after the first ``after``); fails if the process ends
    first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while text not in (log.read_text().partition(after)[2] if after else log.read_text()):
        assert process.poll() is None, log.read_text()[-TAIL:]
        assert time.monotonic() < deadline, f"no {text!r} in time: {log.read_text()[-TAIL:]}"
        time.sleep(0.05)
