"""How ``make test`` spreads the suite over its xdist workers: the longest files first, and the
tests of a file that share a slow module fixture on one worker.

This module imports pytest alone: a test runs a suite through it in a fresh interpreter
(tests/test_suite_schedule.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

# The files that take longest (``pytest --durations``, slowest first), collected first: under
# ``-n 3 --dist loadgroup`` each test (a whole file of :data:`SHARED_FIXTURE`) goes to the next
# free worker, in this order, so the long ones start at once rather than last, when they would
# run on alone while the others idle.
LONGEST_FIRST = (
    "test_ddp",
    "test_resume",
    "test_server",
    "test_frameworks",
    "test_faults_sweeps",
    "test_cli_launchers",
    "test_errors",
    "test_faults",
    "test_faults_checkpoints",
    "test_race_processes",
    "test_wheel",
    "test_race",
    "test_tau_norm_selection",
    "test_report",
    "test_browser",
    "test_docs",
    "test_backbones",
    "test_prefixes",
)
# Files whose tests share a module-scoped fixture that is slow to build (a server, a sweep, a
# process group): their tests stay together in one worker, which builds it once.
SHARED_FIXTURE = (
    "test_browser",
    "test_ddp",
    "test_faults_checkpoints",
    "test_frameworks",
    "test_multilabel_run",
    "test_report",
    "test_resume",
    "test_server",
)


def work_unit(nodeid: str) -> str:
    """What xdist hands to one worker as a whole: the file, for a file in
    :data:`SHARED_FIXTURE`; otherwise the test alone.

    >>> work_unit("tests/test_ddp.py::test_a_rank_that_dies_fails_the_run")
    'tests/test_ddp.py'
    >>> work_unit("tests/test_cli.py::test_default_run_with_no_arguments")
    'tests/test_cli.py::test_default_run_with_no_arguments'
    """
    file = nodeid.partition("::")[0]
    return file if Path(file).stem in SHARED_FIXTURE else nodeid


@pytest.hookimpl(optionalhook=True)  # a hook of xdist's: none without it (-p no:xdist)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadgroup``, xdist's group scheduling with :func:`work_unit` as the group.

    xdist groups the tests of one ``xdist_group`` by a suffix it writes into ``Item._nodeid``,
    which pytest 9.2 no longer reads as the test's id (pytest-dev/pytest-xdist#1386): each
    test went alone to the next free worker, and each of the three workers built a file's
    module fixture again (the process group of tests/test_ddp.py three times). Its public
    hook chooses the unit instead, through ``_split_scope``, the method xdist's own scope
    schedulers override: private, so pyproject.toml bounds pytest-xdist below 4, and
    tests/test_suite_schedule.py fails on a release that stops calling it."""
    if config.getvalue("dist") != "loadgroup":
        return None  # xdist's own
    from xdist.scheduler import LoadGroupScheduling

    class SharedFixtureScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return SharedFixtureScheduling(config, log)


def pytest_configure(config: pytest.Config) -> None:
    """xdist hands out the work in the order collected (the suite's conftest sorts it)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
