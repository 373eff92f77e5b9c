"""What a module computes besides its weights: its structure and its code. The code of classes
from installed packages (torch, timm, torchvision, ...) is named by the packages' versions; the
user's own code (a class defined outside the installed packages, this project's included) by
the bytes of its source files, and of every file of the user's that such a file refers to (the
modules, functions and classes it imports), so that an edited ``forward`` or a helper it calls
gives another digest."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import inspect
import sys
import sysconfig
import types
from pathlib import Path

from torch import nn


def _roots(*keys: str) -> tuple[Path, ...]:
    paths = sysconfig.get_paths()
    return tuple(Path(paths[key]).resolve() for key in keys if paths.get(key))


# Where installed code lives: the standard library (named by Python's version) and the
# environment's site-packages (named by each package's version).
_STDLIB, _SITE = _roots("stdlib", "platstdlib"), _roots("purelib", "platlib")
_PACKAGES = {"site-packages", "dist-packages"}  # any environment's installed packages


class UnreadableCode(Exception):
    """A class of the module is the user's but its source file cannot be read (defined in an
    interactive session, say): nothing would tell an edit of it."""


def code_digest(module: nn.Module) -> str:
    """A digest of ``module``'s structure (its ``repr``: the tree of layers and their settings),
    the versions of the installed packages its classes come from, and the source files of the
    user's code its classes use. Raises :class:`UnreadableCode` naming the class whose source
    cannot be read."""
    digest = hashlib.blake2b(repr(module).encode(), digest_size=16)
    homes: list[types.ModuleType] = []
    for cls in {c for m in module.modules() for c in type(m).__mro__}:
        home = sys.modules.get(cls.__module__)
        if home is None or (_file(home) is None and home.__name__ not in sys.builtin_module_names):
            raise UnreadableCode(f"{cls.__module__}.{cls.__qualname__}")
        homes.append(home)
    for name, part in sorted(_parts(homes).items()):
        digest.update(f"\0{name}\0".encode() + part)
    return digest.hexdigest()


def _parts(homes: list[types.ModuleType]) -> dict[str, bytes]:
    """For every module reachable from ``homes`` through the user's modules' globals: the user's
    module's source bytes, or an installed package's version (by its top-level name)."""
    parts: dict[str, bytes] = {}
    pending, seen = list(homes), set()
    while pending:
        home = pending.pop()
        if home.__name__ in seen:
            continue
        seen.add(home.__name__)
        file = _file(home)
        if file is None:  # built in, or a namespace package: no code of its own
            continue
        if any(file.is_relative_to(root) for root in _SITE) or _PACKAGES & set(file.parts):
            top = home.__name__.partition(".")[0]
            parts[top] = _version(top).encode()
            continue
        if any(file.is_relative_to(root) for root in _STDLIB):
            parts["python"] = sys.version.encode()
            continue
        parts[home.__name__] = file.read_bytes()
        for value in vars(home).values():
            found = value if inspect.ismodule(value) else _home_of(value)
            if found is not None:
                pending.append(found)
    return parts


def _home_of(value: object) -> types.ModuleType | None:
    if inspect.isclass(value) or inspect.isfunction(value):
        return sys.modules.get(value.__module__)
    return None


def _file(home: types.ModuleType) -> Path | None:
    file = getattr(home, "__file__", None)
    return Path(file).resolve() if file and Path(file).is_file() else None


@functools.cache
def _version(top: str) -> str:
    """The installed version of the distribution(s) providing package ``top``."""
    names = importlib.metadata.packages_distributions().get(top, [])
    versions = [f"{n}=={importlib.metadata.version(n)}" for n in sorted(set(names))]
    if versions:
        return ",".join(versions)
    return f"{top}=={getattr(sys.modules.get(top), '__version__', 'unknown')}"
