"""The command line ends without the interpreter's teardown (:mod:`runner.quick_exit`): real
processes, their exit status, their output and what their exit handlers leave."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import ROOT, environment

pytestmark = pytest.mark.slow  # fresh interpreters

# A command in a process of its own: ``how`` it ends, and what is left in ``folder``.
PROGRAM = """
import atexit, logging, logging.handlers, sys
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
    if how == "exit":
        sys.exit(3)
    if how == "bug":
        raise ValueError("a bug")
    if how == "interrupt":
        raise KeyboardInterrupt
"""


def _run(folder: Path, how: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, str(folder), how],
        cwd=ROOT,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(("how", "status"), [("return", 0), ("exit", 3), ("bug", 1)])
def test_a_command_ends_with_its_status_its_handlers_run_and_nothing_is_torn_down(
    tmp_path, how, status
):
    done = _run(tmp_path, how)
    assert done.returncode == status, done.stderr
    assert done.stdout == "printed"  # flushed before the process ended
    assert "its last line" in (tmp_path / "log").read_text()
    assert (tmp_path / "handler ran").exists()  # registered after the command began: it ran
    assert not (tmp_path / "torn down").exists()  # the teardown was skipped
    if how == "bug":  # as Python reports an uncaught exception
        assert "Traceback" in done.stderr and "ValueError: a bug" in done.stderr


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
    done = subprocess.run(
        [sys.executable, "-c", REGISTERED_FIRST],
        cwd=ROOT,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
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
    done = subprocess.run(
        [sys.executable, "-c", AS_PROGRAM, str(tmp_path)],
        cwd=tmp_path,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "sampler:" in done.stdout  # the composed config, printed and flushed
    assert not (tmp_path / "torn down").exists()
