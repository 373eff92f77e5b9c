"""The training core (runner/train/) knows neither Hydra nor MLflow: importing it loads neither,
and no module below the app imports the MLflow side (runner.tracking)."""

from __future__ import annotations

import ast
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import runner

pytestmark = pytest.mark.unit

RUNNER = Path(runner.__file__).parent
# The app: the Hydra boundary, the MLflow side and what runs a sweep. Everything else in
# runner/ is below it (the training core, the data, the models and their helpers).
APP = {
    "__main__.py",
    "app.py",
    "build.py",
    "checks.py",
    "config.py",
    "explain.py",
    "fingerprint.py",
    "job.py",
    "results.py",
    "resume.py",
}
APP_PACKAGES = {"sweeps", "tracking", "conf"}
BOUNDARY = ("mlflow", "hydra", "omegaconf")


def _core_modules() -> list[str]:
    return sorted(f"runner.train.{p.stem}" for p in (RUNNER / "train").glob("*.py"))


def _below_app() -> list[Path]:
    return sorted(
        p
        for p in RUNNER.rglob("*.py")
        if p.relative_to(RUNNER).parts[0] not in APP_PACKAGES and p.name not in APP
    )


def _imported(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of its code (function-level imports too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_importing_the_core_in_a_fresh_interpreter_loads_neither_hydra_nor_mlflow():
    modules = _core_modules()
    assert "runner.train.fit" in modules and "runner.train.stages" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {BOUNDARY!r}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout


def test_no_module_below_the_app_imports_the_mlflow_side():
    below = _below_app()
    assert RUNNER / "train" / "fit.py" in below and RUNNER / "app.py" not in below
    offenders = {
        str(path.relative_to(RUNNER)): sorted(
            name for name in _imported(path) if name.startswith("runner.tracking")
        )
        for path in below
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_core_imports_neither_hydra_omegaconf_nor_mlflow_anywhere_in_its_code():
    """Also inside functions, where the fresh interpreter's import would not see them."""
    found = {
        path.name: sorted(n for n in _imported(path) if n.split(".")[0] in BOUNDARY)
        for path in (RUNNER / "train").glob("*.py")
    }
    assert {k: v for k, v in found.items() if v} == {}


def test_models_logged_before_the_core_moved_find_their_classes():
    """MLflow pickles a logged model's classes by module path: an LWS head was
    runner.decoupled.ScaledClassifier, a frozen backbone runner.features.FrozenBackbone."""
    from runner.models.backbones import FrozenBackbone
    from runner.models.heads import ScaledClassifier

    for module, cls in (
        ("runner.decoupled", ScaledClassifier),
        ("runner.features", FrozenBackbone),
    ):
        # Protocol 0 names a class as text ("c<module>\n<name>"): the old reference, resolved today.
        old = pickle.dumps(cls, protocol=0).replace(cls.__module__.encode(), module.encode())
        assert pickle.loads(old) is cls


def test_help_loads_neither_torch_nor_mlflow():
    """``python -m runner --help`` answers from Hydra and the config alone (importtime lists
    every module a fresh interpreter imports, each on its own line)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "runner", "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert "hydra" in imported and "runner.config" in imported  # the listing is read right
    assert not {"torch", "mlflow", "runner.train.fit"} & imported
