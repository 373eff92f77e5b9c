"""The tests' own machinery: the CLI helper fails with the whole story in one message, and the
kinds of test are the markers pyproject.toml registers."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import KINDS
from tests.helpers.cli import ROOT, _interpreter, environment, run_python, runner_args
from tests.helpers.warm import WarmProcess

pytestmark = pytest.mark.unit

LOUD = "import sys; print('out-' * 2000 + 'END-OUT'); sys.stderr.write('err-' * 2000 + 'END-ERR')"


def test_an_unexpected_exit_fails_with_the_command_its_status_and_both_tails(tmp_path):
    with pytest.raises(pytest.fail.Exception) as failed:
        run_python("-c", f"{LOUD}; sys.exit(3)", cwd=tmp_path)
    message = str(failed.value)
    assert "sys.exit(3)" in message and "exit status 3, expected 0" in message
    assert "END-OUT" in message and "END-ERR" in message
    assert len(message) < 7000  # the tails, not the whole output


def test_an_expected_status_or_any_status_is_returned(tmp_path):
    assert run_python("-c", f"{LOUD}; sys.exit(2)", cwd=tmp_path, expect=2).returncode == 2
    done = run_python("-c", f"{LOUD}; sys.exit(5)", cwd=tmp_path, expect=None)
    assert done.returncode == 5 and done.stderr.endswith("END-ERR")


def test_a_run_past_its_timeout_fails_with_what_it_printed(tmp_path):
    code = "import sys, time; print('started', flush=True); time.sleep(30)"
    with pytest.raises(pytest.fail.Exception) as failed:
        run_python("-c", code, cwd=tmp_path, timeout=2)
    assert "still running after 2 s" in str(failed.value)


def test_the_subprocess_runs_this_checkout_with_the_extra_variables(tmp_path):
    code = "import os, runner; print(os.environ['EXTRA']); print(runner.__file__)"
    done = run_python("-c", code, cwd=tmp_path, env={"EXTRA": "given"})
    extra, module = done.stdout.splitlines()
    assert extra == "given" and module == str(ROOT / "runner" / "__init__.py")


def test_runner_arguments_put_multirun_first_and_the_store_last():
    assert runner_args(("seed=1",), uri="sqlite:///x.db", multirun=True) == [
        "-m",
        "runner",
        "-m",
        "seed=1",
        "prefixes.cache_dir=prefix-cache",  # a sweep's shared prefixes: in the test's folder
        "tracking.uri=sqlite:///x.db",
    ]
    assert runner_args(("prefixes.cache_dir=c",), multirun=True) == [
        "-m",
        "runner",
        "-m",
        "prefixes.cache_dir=c",
    ]
    assert runner_args(()) == ["-m", "runner"]


def test_the_kinds_are_the_markers_pytest_registered_from_pyproject(pytestconfig):
    registered = [line.split(":", 1)[0].strip() for line in pytestconfig.getini("markers")]
    assert set(KINDS) <= set(registered) and "slow" in KINDS and "unit" in KINDS


EXITS = ["-m", "tests.helpers.exits"]


@pytest.mark.slow  # real processes, forked and fresh
@pytest.mark.parametrize("what", [["exit", "0"], ["exit", "3"], ["raise"], ["interrupt"]])
def test_a_forked_command_ends_as_a_fresh_interpreter_running_it_does(what, tmp_path):
    """The warm interpreter's child and ``python -m`` give the same status (an uncaught
    KeyboardInterrupt: death by SIGINT), output, working directory, environment and argv."""
    runs = [
        run_python(*EXITS, *what, cwd=tmp_path, env={"EXTRA": "x"}, expect=None, fresh=fresh)
        for fresh in (False, True)
    ]
    warm, fresh = runs
    assert warm.returncode == fresh.returncode, (warm, fresh)
    assert warm.stdout == fresh.stdout
    assert f"cwd={tmp_path} extra=x argv0=exits.py main=__main__" in warm.stdout
    assert ("Traceback" in warm.stderr) == ("Traceback" in fresh.stderr)
    assert warm.stderr.startswith("to stderr")


@pytest.mark.slow
def test_a_forked_command_is_signalled_and_timed_out_like_a_process(tmp_path):
    log = tmp_path / "log"
    log.write_bytes(b"")
    interpreter = _interpreter()
    ident, pid = interpreter.start(
        "tests.helpers.exits", ["sleep"], tmp_path, environment(), log, log
    )
    process = WarmProcess(interpreter, ident, pid, [sys.executable, *EXITS, "sleep"])
    deadline = time.monotonic() + 30
    while "sleeping" not in log.read_text():
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=0.1)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == -signal.SIGTERM
    process.send_signal(signal.SIGTERM)  # ended and reaped: nothing is signalled
    with pytest.raises(pytest.fail.Exception) as failed:
        run_python(*EXITS, "sleep", cwd=tmp_path, timeout=2)
    assert "still running after 2 s" in str(failed.value) and "sleeping" in str(failed.value)


@pytest.mark.slow
def test_commands_forked_at_once_from_two_threads_each_get_their_own_status(tmp_path):
    def one(code: int) -> int:
        return run_python(*EXITS, "exit", str(code), cwd=tmp_path, expect=code).returncode

    with ThreadPoolExecutor(max_workers=2) as pool:
        assert list(pool.map(one, range(6))) == list(range(6))
