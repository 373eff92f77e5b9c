"""What an install needs: the samplers package with torch and nothing else, every package the
code imports declared in pyproject.toml, and the ``samplerlab`` command declared."""

from __future__ import annotations

import ast
import json
import pkgutil
import re
import subprocess
import sys
import tomllib
from functools import cache
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
OURS = {"samplers", "runner", "experiments", "hydra_plugins"}
# The integrations that exist to be used inside a framework import it (and say so).
FRAMEWORK_MODULES = {
    f"samplers.integrations.{name}" for name in ("accelerate", "lightning", "transformers")
}


@cache
def modules_of_distributions() -> dict[str, set[str]]:
    """Each installed distribution (canonical name) and the top-level modules it provides."""
    provides: dict[str, set[str]] = {}
    for module, distributions in packages_distributions().items():
        for distribution in distributions:
            provides.setdefault(canonicalize_name(distribution), set()).add(module)
    return provides


def dependency_closure(distribution: str) -> set[str]:
    """``distribution`` and what it requires, recursively (markers evaluated here, no extras)."""
    seen: set[str] = set()
    todo = [canonicalize_name(distribution)]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            wanted = requires(name) or []
        except PackageNotFoundError:  # not installed on this platform: nothing to import
            continue
        for line in wanted:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(requirement.name))
    return seen


# In a fresh interpreter: refuse every top-level import outside ``allowed`` (as if not
# installed), import the samplers modules, and report what failed and what was refused.
BARE = """
import importlib, json, sys
allowed = set(json.loads(sys.argv[1]))
refused = []
class Bare:
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if path is None and top not in allowed and top not in sys.stdlib_module_names:
            refused.append(top)
            raise ModuleNotFoundError(f"No module named {name!r} (not installed here)", name=name)
        return None
sys.meta_path.insert(0, Bare())
failed = {}
for module in json.loads(sys.argv[2]):
    try:
        importlib.import_module(module)
    except Exception as error:
        failed[module] = repr(error)
print(json.dumps({"failed": failed, "refused": sorted(set(refused))}))
"""


def samplers_modules() -> list[str]:
    import samplers

    found = pkgutil.walk_packages(samplers.__path__, prefix="samplers.")
    names = ["samplers", *(module.name for module in found)]
    return sorted(name for name in names if name not in FRAMEWORK_MODULES)


def test_samplers_import_with_torch_alone():
    """Every samplers module (samplers.integrations too; its framework modules aside) imports
    in an interpreter that can import only the standard library and torch's own dependency
    closure (pip's metadata, followed recursively, mapped to the modules those distributions
    provide). This stands in for a bare environment with torch alone, which would cost CI
    minutes to build: anything else installed here is refused at import, as if missing.
    torch's own optional imports (numpy, when present) are refused too, which torch allows."""
    provides = modules_of_distributions()
    allowed = {"samplers"} | {m for d in dependency_closure("torch") for m in provides.get(d, ())}
    modules = samplers_modules()
    assert {"samplers", "samplers.integrations", "samplers.strategies"} <= set(modules)
    done = subprocess.run(
        [sys.executable, "-c", BARE, json.dumps(sorted(allowed)), json.dumps(modules)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["failed"] == {}, report
    # Not even asked for (a guarded import would pass the line above, refused in silence): the
    # runner's stack and the frameworks, which only samplers.integrations' own modules import.
    stack = {"runner", "hydra", "omegaconf", "mlflow", "sklearn", "lightning", "pytorch_lightning"}
    stack |= {"accelerate", "torchdata", "transformers"}
    assert not stack & set(report["refused"]), report


def test_the_bare_interpreter_refuses_what_torch_does_not_bring():
    """The check above can fail: a module that imports numpy does not import there."""
    done = subprocess.run(
        [sys.executable, "-c", BARE, json.dumps(["torch"]), json.dumps(["json", "numpy"])],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert list(report["failed"]) == ["numpy"] and report["refused"] == ["numpy"]


def imported_packages(package: str) -> set[str]:
    """The top-level modules ``package``'s files import, outside the standard library and the
    project's own packages."""
    found: set[str] = set()
    for file in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name.partition(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.partition(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m not in OURS | {"__future__"}}


def declared(requirements: list[str]) -> set[str]:
    """The modules the ``requirements`` (pyproject lines) provide, as installed here."""
    provides = modules_of_distributions()
    return {
        m
        for line in requirements
        for m in provides.get(canonicalize_name(Requirement(line).name), ())
    }


def test_samplers_itself_imports_only_torch_and_its_frameworks():
    """Beside the runtime check: a direct import samplers makes of a package torch happens to
    import (numpy) would go unseen there."""
    frameworks = {"accelerate", "lightning", "transformers"}
    assert imported_packages("samplers") - frameworks == {"torch"}


def test_every_imported_package_is_declared():
    """What the installed packages import comes with the install: the runner's stack by
    default, the frameworks' integrations with their extras."""
    extras = PROJECT["optional-dependencies"]
    default = declared(PROJECT["dependencies"])
    # data=hf imports datasets, features.engine=onnxruntime ONNX Runtime, each after
    # runner.extras.require names its extra.
    assert 'require("datasets", "hf"' in (ROOT / "runner" / "data" / "hf.py").read_text()
    engine = (ROOT / "runner" / "train" / "onnx_engine.py").read_text()
    assert 'require(module, "onnx"' in engine and '("onnxruntime", "onnxscript")' in engine
    optional = declared([*extras["hf"], *extras["onnx"]])
    for package in ("runner", "experiments", "hydra_plugins"):
        assert imported_packages(package) - default - optional == set(), package
    frameworks = declared(
        [r for name in ("lightning", "accelerate", "transformers") for r in extras[name]]
    )
    assert imported_packages("samplers") - default - frameworks == set()


def test_the_samplerlab_command_is_declared():
    target = PROJECT["scripts"]["samplerlab"]
    module, _, function = target.partition(":")
    assert re.fullmatch(r"[\w.]+", module) and module.split(".")[0] in OURS
    assert callable(getattr(__import__(module, fromlist=[function]), function))
