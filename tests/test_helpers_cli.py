"""The tests' own machinery: the CLI helper fails with the whole story in one message; a command
run in process ends as a fresh interpreter running it does and leaves the test process as it
found it; the kinds of test are the markers pyproject.toml registers; a DeprecationWarning from
our own code fails a test, one from other code does not."""

from __future__ import annotations

import logging
import os
import signal
import sys
import warnings

import pytest
import torch
from hydra.core.hydra_config import HydraConfig

from runner import quick_exit
from tests.conftest import KINDS
from tests.helpers.cli import ROOT, run_cli, run_python, runner_args

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


@pytest.mark.slow  # real processes, fresh, beside the same commands in process
@pytest.mark.parametrize("what", [["exit", "0"], ["exit", "3"], ["raise"], ["interrupt"]])
def test_a_command_in_process_ends_as_a_fresh_interpreter_running_it_does(what, tmp_path):
    """In process and ``python -m`` give the same status (an uncaught KeyboardInterrupt: death
    by SIGINT), output, working directory, environment and argv."""
    runs = [
        run_python(*EXITS, *what, cwd=tmp_path, env={"EXTRA": "x"}, expect=None, fresh=fresh)
        for fresh in (False, True)
    ]
    here, fresh = runs
    assert here.returncode == fresh.returncode, (here, fresh)
    assert here.stdout == fresh.stdout
    assert f"cwd={tmp_path} extra=x argv0=exits.py main=__main__" in here.stdout
    assert ("Traceback" in here.stderr) == ("Traceback" in fresh.stderr)
    assert here.stderr.startswith("to stderr")
    if what == ["interrupt"]:
        assert here.returncode == -signal.SIGINT


@pytest.mark.slow
def test_a_runner_error_in_process_is_what_a_fresh_interpreter_prints(tmp_path):
    """A user error's exit status and its lines, the same in process and in a new interpreter."""
    runs = [
        run_cli("trainer.lr=0", cwd=tmp_path, uri="sqlite:///x.db", expect=2, fresh=fresh)
        for fresh in (False, True)
    ]
    assert runs[0].stderr == runs[1].stderr and "trainer.lr" in runs[0].stderr
    assert runs[0].stdout == runs[1].stdout


def process_state() -> tuple[object, ...]:
    """What a command run in process may change in it."""
    return (
        os.getcwd(),
        dict(os.environ),
        list(sys.argv),
        signal.getsignal(signal.SIGTERM),
        list(logging.getLogger().handlers),
        torch.get_num_threads(),
        HydraConfig.initialized(),
        (quick_exit.armed(), quick_exit.ended_with()),  # this process ends as pytest ends it
    )


@pytest.mark.slow
def test_a_command_in_process_leaves_this_process_as_it_found_it(tmp_path, tracking_uri):
    """The working directory, environment, argument list, signal handlers, logging, torch's
    threads and Hydra's job config after a run that changed them all (Hydra configures logging
    and sets the job's config, the trainer sets its threads, the runner its variables and
    handlers, the program its quick exit): a later test calling the runner in process must not
    find itself in a job."""
    before = process_state()
    for multirun in (False, True):  # a sweep leaves its config as the job's config
        run_cli(
            "trainer.epochs=1",
            "trainer.threads=2",
            "tracking.plots=false",
            cwd=tmp_path,
            uri=tracking_uri,
            multirun=multirun,
        )
        assert process_state() == before, multirun


@pytest.mark.parametrize(
    "module",
    [
        "runner.app",
        "samplers.base",
        "experiments.report",
        "scripts.tables",
        "hydra_plugins.samplerlab_race.race_sweeper",
    ],
)
def test_a_deprecation_warning_from_our_code_fails_the_test(module):
    with pytest.raises(DeprecationWarning, match="old"):
        warnings.warn_explicit("old", DeprecationWarning, "here.py", 1, module=module)


@pytest.mark.parametrize(
    "module", ["mlflow.tracking", "hydra_plugins.hydra_joblib_launcher", "runners"]
)
def test_a_deprecation_warning_from_other_code_is_ignored(module):
    with warnings.catch_warnings(record=True) as seen:
        warnings.warn_explicit("old", DeprecationWarning, "here.py", 1, module=module)
    assert seen == []
