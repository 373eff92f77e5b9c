"""The command line ends without the interpreter's teardown (:mod:`runner.quick_exit`): real
processes, their exit status, their output and what their exit handlers leave."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cli import ROOT, environment

pytestmark = pytest.mark.slow  # fresh interpreters

# A command in a process of its own: ``how`` it ends, and what is left in ``folder``.
PROGRAM = """
import atexit, ctypes, logging, logging.handlers, sys
from pathlib import Path
from runner import quick_exit

folder, how = Path(sys.argv[1]), sys.argv[2]

class Kept:
    def __del__(self):  # when the interpreter's teardown frees this module's objects
        (folder / "torn down").write_text("")

kept = Kept()
# A handler that holds its records until it is flushed or closed (by logging.shutdown).
held = logging.handlers.MemoryHandler(100, logging.CRITICAL, logging.FileHandler(folder / "log"))
logging.getLogger().addHandler(held)
logging.getLogger().setLevel(logging.INFO)
with quick_exit.command():
    atexit.register(lambda: (folder / "handler ran").write_text(""))
    logging.getLogger("command").info("its last line")
    print("printed", end="")  # to a pipe: held in the buffer until flushed
    ctypes.CDLL(None).printf(b" by C")  # held in the C library's buffer
    if how == "exit":
        sys.exit(3)
    if how == "bare exit":
        sys.exit()
    if how == "message":
        sys.exit("a message")
    if how == "bug":
        raise ValueError("a bug")
    if how == "interrupt":
        raise KeyboardInterrupt
"""


def _buffered() -> dict[str, str]:
    """The tests' environment with output buffered as a user's is (PYTHONUNBUFFERED makes
    Python's and the C library's streams write at once)."""
    return {k: v for k, v in environment().items() if k != "PYTHONUNBUFFERED"}


def _python(program: str, *args: str, cwd: Path = ROOT, stdout: Any = subprocess.PIPE):
    """``python -c program *args`` in a fresh interpreter, buffered as a user's (stdout
    captured unless given), to its end."""
    return subprocess.run(
        [sys.executable, "-c", program, *args],
        cwd=cwd,
        env=_buffered(),
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )


def _run(folder: Path, how: str) -> subprocess.CompletedProcess[str]:
    return _python(PROGRAM, str(folder), how)


@pytest.mark.parametrize(
    ("how", "status"),
    [("return", 0), ("exit", 3), ("bare exit", 0), ("message", 1), ("bug", 1)],
)
def test_a_command_ends_with_its_status_its_handlers_run_and_nothing_is_torn_down(
    tmp_path, how, status
):
    done = _run(tmp_path, how)
    assert done.returncode == status, done.stderr
    # Both buffers written before the process ended (in which order is the C library's).
    assert sorted(done.stdout.split(" by C")) == ["", "printed"], done.stdout
    assert "its last line" in (tmp_path / "log").read_text()
    assert (tmp_path / "handler ran").exists()  # registered after the command began: it ran
    assert not (tmp_path / "torn down").exists()  # the teardown was skipped
    if how == "bug":  # as Python reports an uncaught exception
        assert "Traceback" in done.stderr and "ValueError: a bug" in done.stderr
    if how == "message":
        assert done.stderr.strip() == "a message"


def test_output_that_cannot_be_written_ends_as_python_reports_it(tmp_path):
    with open("/dev/full", "w") as full:  # every write: no space left on the device
        done = _python(PROGRAM, str(tmp_path), "return", stdout=full)
    assert done.returncode == 120, done.stderr  # Python's status for a flush that failed
    assert "No space left on device" in done.stderr


def test_an_uncaught_interrupt_ends_as_python_ends_it(tmp_path):
    done = _run(tmp_path, "interrupt")
    assert done.returncode == -signal.SIGINT, done.stderr  # Python kills itself with SIGINT
    assert (tmp_path / "handler ran").exists() and (tmp_path / "torn down").exists()


# Before ``python -m runner`` (and ``samplerlab run`` or ``advise``, which run it in process)
# enters quick_exit.command(), what has registered an exit handler: only what it runs itself.
REGISTERED_FIRST = """
import atexit, runpy

seen = []
register = atexit.register

def recording(function, *args, **kwargs):
    seen.append(f"{function.__module__}.{function.__qualname__}")
    return register(function, *args, **kwargs)

atexit.register = recording
import experiments.command  # the samplerlab command, which runs the runner in process
runpy.run_module("runner", run_name="imported")  # runner/__main__.py's imports, not main()
print(seen)
"""


def test_only_loggings_exit_handler_is_registered_before_the_command_begins():
    done = _python(REGISTERED_FIRST)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['logging.shutdown']", done.stdout


# python -m runner as the program, with an object of the program's own kept to the end.
AS_PROGRAM = """
import runpy, sys
from pathlib import Path

class Kept:
    def __init__(self, marker):
        self.marker = marker

    def __del__(self):
        self.marker.write_text("")

kept = Kept(Path(sys.argv[1]) / "torn down")
sys.argv = ["runner", "--cfg", "job"]
runpy.run_module("runner", run_name="__main__", alter_sys=True)
"""


def test_python_m_runner_ends_without_the_teardown(tmp_path):
    done = _python(AS_PROGRAM, str(tmp_path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "sampler:" in done.stdout  # the composed config, printed and flushed
    assert not (tmp_path / "torn down").exists()


# samplerlab's main() called by a program of the user's, which goes on and fails afterwards.
CALLED = """
import atexit, sys
from pathlib import Path
from experiments.command import main

marker = Path(sys.argv[1]) / "caller's handler ran"  # main() changes sys.argv
atexit.register(marker.write_text, "")
assert main(["run", "--cfg", "job"]) == 0
raise RuntimeError("the caller's own failure")
"""


def test_samplerlab_called_from_code_leaves_the_callers_end_to_it(tmp_path):
    done = _python(CALLED, str(tmp_path), cwd=tmp_path)
    assert done.returncode == 1 and "RuntimeError: the caller's own failure" in done.stderr
    assert (tmp_path / "caller's handler ran").exists()
