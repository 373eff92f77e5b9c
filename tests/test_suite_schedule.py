"""How ``make test`` spreads the suite (tests/helpers/schedule.py): a real pytest with real xdist
workers, in a fresh interpreter, runs a small suite whose file shares a module fixture: every
test of that file runs on one worker, which builds the fixture once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import environment
from tests.helpers.schedule import LONGEST_FIRST, SHARED_FIXTURE, work_unit

pytestmark = pytest.mark.unit

TESTS = Path(__file__).parent
SHARED_FILE = """
import os
import pytest

@pytest.fixture(scope="module")
def built():
    with open("built.txt", "a") as file:
        file.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")

@pytest.mark.parametrize("n", range(8))
def test_shared(n, built):
    with open("ran.txt", "a") as file:
        file.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
"""
OTHER_FILE = """
import pytest

@pytest.mark.parametrize("n", range(8))
def test_other(n):
    pass
"""


def test_a_shared_fixture_files_tests_run_on_one_worker_that_builds_it_once(tmp_path):
    shared = SHARED_FIXTURE[0]
    (tmp_path / f"{shared}.py").write_text(SHARED_FILE)
    (tmp_path / "test_other.py").write_text(OTHER_FILE)
    (tmp_path / "conftest.py").write_text(
        "from tests.helpers.schedule import pytest_configure, pytest_xdist_make_scheduler\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup"]
        + ["-p", "no:cacheprovider"],
        cwd=tmp_path,
        env={k: v for k, v in environment().items() if k != "PYTEST_ADDOPTS"},  # its own options
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "16 passed" in done.stdout, done.stdout[-3000:]
    ran = (tmp_path / "ran.txt").read_text().split()
    assert len(ran) == 8 and len(set(ran)) == 1, ran  # one worker ran them all
    assert (tmp_path / "built.txt").read_text().split() == ran[:1]  # and built it once


def test_the_suite_schedules_through_the_hook_and_names_its_own_files():
    from tests import conftest
    from tests.helpers import schedule

    assert conftest.pytest_xdist_make_scheduler is schedule.pytest_xdist_make_scheduler
    files = {path.stem for path in TESTS.glob("test_*.py")}
    assert set(LONGEST_FIRST) <= files, set(LONGEST_FIRST) - files
    assert set(SHARED_FIXTURE) <= files, set(SHARED_FIXTURE) - files
    assert work_unit(f"tests/{SHARED_FIXTURE[0]}.py::test_x[1]") == f"tests/{SHARED_FIXTURE[0]}.py"
    assert work_unit("tests/test_cli.py::test_x[1]") == "tests/test_cli.py::test_x[1]"
