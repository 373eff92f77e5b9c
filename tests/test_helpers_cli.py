"""The tests' own machinery: the CLI helper fails with the whole story in one message, and the
kinds of test are the markers pyproject.toml registers."""

from __future__ import annotations

import pytest

from tests.conftest import KINDS
from tests.helpers.cli import ROOT, run_python, runner_args

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
        "tracking.uri=sqlite:///x.db",
    ]
    assert runner_args(()) == ["-m", "runner"]


def test_the_kinds_are_the_markers_pytest_registered_from_pyproject(pytestconfig):
    registered = [line.split(":", 1)[0].strip() for line in pytestconfig.getini("markers")]
    assert set(KINDS) <= set(registered) and "slow" in KINDS and "unit" in KINDS
