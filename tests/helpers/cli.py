"""The project's command lines run as a user runs them: to completion (:func:`run_cli`; any
module with :func:`run_python`) or started in the background for signal tests (:func:`start_cli`,
:func:`wait_for`). A run that ends otherwise than expected fails the test with its command line,
exit status and the ends of its output in one message.

``python -m module ...`` run to completion runs in this process (:mod:`tests.helpers.in_process`):
the same code from its arguments on, without a new interpreter's imports. A fresh interpreter
runs what needs a process of its own: ``fresh=True`` (start-up itself, the status the system
reports, launchers whose jobs are other processes, several commands at once), a ``preexec_fn``,
other interpreter arguments, and the background runs of :func:`start_cli`, which tests signal."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from tests.helpers.in_process import run_module

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
    ``python -m`` commands run in this process unless ``fresh`` (or a ``preexec_fn``) asks for
    a new interpreter."""
    if args[:1] == ("-m",) and len(args) > 1 and preexec_fn is None and not fresh:
        done = run_module(args[1], list(args[2:]), cwd, environment(env), timeout)
    else:
        command = [sys.executable, *args]
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
) -> subprocess.Popen[bytes]:
    """``python -m runner`` started in the background in a fresh interpreter, stdout and stderr
    unbuffered into ``log``, for a test to signal; the test waits for it
    (``process.wait(timeout=...)``)."""
    command = [sys.executable, *runner_args(overrides, uri, multirun)]
    with open(log, "wb") as output:  # there before the process starts: the test reads it at once
        return subprocess.Popen(
            command,
            cwd=cwd,
            env=environment({"PYTHONUNBUFFERED": "1"}),
            stdout=output,
            stderr=subprocess.STDOUT,
        )


def wait_for(
    log: Path, text: str, process: subprocess.Popen[bytes], after: str = "", timeout: float = 240
) -> None:
    """Until ``text`` appears in ``log`` (after the first ``after``); fails if the process ends
    first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while text not in (log.read_text().partition(after)[2] if after else log.read_text()):
        assert process.poll() is None, log.read_text()[-TAIL:]
        assert time.monotonic() < deadline, f"no {text!r} in time: {log.read_text()[-TAIL:]}"
        time.sleep(0.05)
