"""The examples of docs/trainers.md, run as written (in a scratch folder)."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

from samplers import Sampler

DOC = Path(__file__).resolve().parents[3] / "docs" / "trainers.md"


def examples() -> dict[str, str]:
    """The page's ``python`` blocks that start with ``# example: NAME``, by name."""
    blocks = re.findall(r"```python\n# example: (\w+)\n(.*?)```", DOC.read_text(), flags=re.S)
    return dict(blocks)


def run(name: str) -> dict[str, Any]:
    """Run one example; what its sampler holds at the end."""
    here = os.getcwd()
    scope: dict[str, Any] = {"__name__": "__main__"}
    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)
        try:
            exec(compile(examples()[name], f"{DOC} ({name})", "exec"), scope)
        finally:
            os.chdir(here)
    sampler = scope.get("sampler") or scope["data"].sampler
    assert isinstance(sampler, Sampler)
    out: dict[str, Any] = {"epoch": sampler.epoch, "shares": sampler.target_class_shares().tolist()}
    for state in sampler.feedback_state:
        out[state] = getattr(sampler, state).double().tolist()
    return out


def lightning() -> dict[str, Any]:
    return run("lightning")


def fabric() -> dict[str, Any]:
    return run("fabric")


def accelerate() -> dict[str, Any]:
    return run("accelerate")


def transformers() -> dict[str, Any]:
    return run("transformers")


def torchdata() -> dict[str, Any]:
    return run("torchdata")
