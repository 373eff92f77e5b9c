"""A normal install: a wheel built from a copy of this checkout, installed into a new
environment that sees the project's dependencies but not the checkout, runs every command from
an empty folder, finds its configs and the race plugin through the installed package, and
writes nothing under the checkout or the installed package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import numpy as np
import pytest

from runner.config import CONF
from tests.helpers.cli import run_command

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["samplerlab"]
# What runs leave in the checkout that is not there to begin with: pytest's and the tools' own
# folders aside (and the environment the checkout runs in).
TOOLS = (".venv/", ".pytest_cache/", ".hypothesis/", ".mypy_cache/", ".ruff_cache/")
QUICK = ["trainer.epochs=1", "tracking.plots=false", "tracking.log_model=false"]


def build_wheel(folder: Path) -> Path:
    """The wheel of this working tree (its tracked and untracked, not ignored, files copied to
    ``folder``, so that the build's own files stay out of the checkout), built offline."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    source = folder / "source"
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():  # a tracked file deleted in the working tree is not built
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
    env = {**os.environ, "PIP_NO_CACHE_DIR": "1"}
    run_command([*pip, "-w", str(folder / "dist"), str(source)], cwd=folder, env=env)
    (wheel,) = (folder / "dist").glob("samplerlab-*.whl")
    return wheel


def new_environment(folder: Path) -> Path:
    """A new virtual environment's python, which imports this environment's packages through a
    .pth line (its site-packages on the path; the .pth files there, this checkout's editable
    install among them, are not read) and not the checkout."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    own = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    paths = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (Path(own) / "samplerlab-test-deps.pth").write_text("".join(f"{p}\n" for p in paths))
    return python


def files_under(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder``: its size and modification time (ns)."""
    return {
        str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns)
        for path in folder.rglob("*")
        if path.is_file()
    }


def left_in_checkout() -> set[str]:
    """The untracked and ignored entries of the checkout, the tools' own and __pycache__ aside
    (another process's edits of tracked files are not this test's)."""
    status = subprocess.run(
        ["git", "status", "--porcelain", "--ignored", "--untracked-files=all"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    entries = {line[3:] for line in status if line[:2] in ("??", "!!")}
    return {e for e in entries if not e.startswith(TOOLS) and "__pycache__/" not in e}


def test_a_wheel_installed_elsewhere_runs_from_an_empty_folder(tmp_path, tracking_uri, user_cache):
    if not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to compare what is left in it")
    before = left_in_checkout()
    wheel = build_wheel(tmp_path / "build")
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = {f"runner/conf/{p.relative_to(CONF)}" for p in CONF.rglob("*.yaml")}
    assert "runner/conf/config.yaml" in configs and configs <= names, configs - names
    assert "hydra_plugins/samplerlab_race/race_sweeper.py" in names
    (entry_points,) = (n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert f"samplerlab = {SCRIPT}" in zipfile.ZipFile(wheel).read(entry_points).decode()

    python = new_environment(tmp_path / "venv")
    bin_folder = python.parent
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env |= {"MLFLOW_TRACKING_URI": tracking_uri, "PIP_NO_CACHE_DIR": "1"}
    work = tmp_path / "work"  # the empty folder every command starts in
    work.mkdir()
    where = [str(python), "-c", "import runner; print(runner.__file__)"]
    spec = "import importlib.util as u; s = u.find_spec('runner'); print(s.origin if s else '')"
    seen = run_command([str(python), "-c", spec], cwd=work, env=env).stdout.strip()
    assert not Path(seen).is_relative_to(ROOT / "runner"), seen  # the editable install unread
    pip = [str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed"]
    run_command([*pip, str(wheel)], cwd=work, env=env)
    site = Path(run_command(where, cwd=work, env=env).stdout.strip()).parents[1]
    assert site.is_relative_to(tmp_path / "venv"), site
    installed = files_under(tmp_path / "venv")

    # Without a store named, runs write to mlflow.db where they start, not in site-packages.
    default_store = "from runner.tracking.stores import resolve_uri; print(resolve_uri(None))"
    no_store = {k: v for k, v in env.items() if k != "MLFLOW_TRACKING_URI"}
    store = run_command([str(python), "-c", default_store], cwd=work, env=no_store).stdout
    assert store.strip() == f"sqlite:///{work.resolve() / 'mlflow.db'}"

    samplerlab = str(bin_folder / "samplerlab")
    top = run_command([samplerlab, "--help"], cwd=work, env=env, timeout=60).stdout
    assert top.startswith("usage: samplerlab") and "\n    advise " in top
    done = run_command([samplerlab, "run", *QUICK], cwd=work, env=env)
    assert "final" in done.stdout and (work / "outputs").is_dir()
    module = [str(python), "-m", "runner", "sampler=annealed", *QUICK]
    assert "final" in run_command(module, cwd=work, env=env).stdout
    # The sweeper's config exists once Hydra has found the plugin (advise then races with it).
    race = [str(python), "-m", "runner", "hydra/sweeper=race", "--cfg", "hydra"]
    composed = run_command(race, cwd=work, env=env).stdout
    assert "_target_: hydra_plugins.samplerlab_race.race_sweeper.RaceSweeper" in composed
    data = tmp_path / "small.npz"
    rng, y = np.random.default_rng(0), np.repeat([0, 1, 2], [40, 25, 15])
    np.savez(data, x=(rng.normal(size=(80, 4)) + y[:, None]).astype(np.float32), y=y)
    advise = [samplerlab, "advise", str(data), "--samplers", "uniform,weighted", "--val", "4"]
    advise += ["--budget", "4", "hydra.sweeper.min_seeds=2", *QUICK]
    raced = run_command(advise, cwd=work, env=env).stdout
    assert raced.startswith("samplerlab run -m hydra/sweeper=race data=tensor_file")
    assert raced_runs(tracking_uri) == 4  # round 1: 2 candidates x 2 seeds, the whole budget

    assert sorted(os.listdir(work)) == ["multirun", "outputs"]  # Hydra's; the store elsewhere
    assert files_under(tmp_path / "venv") == installed
    assert left_in_checkout() == before


def raced_runs(uri: str) -> int:
    """The finished jobs of the race ``samplerlab advise`` ran (experiment ``advise``)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("advise")
    assert experiment is not None, "samplerlab advise recorded no experiment 'advise'"
    runs = client.search_runs([experiment.experiment_id], "attributes.status = 'FINISHED'")
    return sum("mlflow.parentRunId" in run.data.tags for run in runs)
