"""What a module computes besides its weights: its structure and its code. The code of classes
from installed packages (torch, timm, torchvision, ...) is named by the packages' versions; the
user's own code (a class defined outside the installed packages and the standard library, this
project's included) by the bytes of its source files, and of every file of the user's that such
a file imports, transitively: every ``import`` statement of the file, a function's body
included, relative ones resolved against its package. So an edited ``forward``, a helper it
calls, a constant it imports by name or a module it imports only inside a function gives
another digest. What no import statement names (a module whose name is computed at run time
and not held by a name a module's source binds, a file read with ``open``) is not seen."""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.machinery
import importlib.metadata
import importlib.util
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
    """For every module reachable from ``homes`` through the user's code: the user's module's
    source bytes, or an installed package's version (by its top-level name), or Python's version
    for the standard library. A user's module leads on to its parent packages (whose
    ``__init__`` an import runs), to every module its ``import`` statements name, wherever they
    are (a function's body included, whether or not it has run), and to the modules of the
    modules, classes and functions its globals hold. Modules not imported yet are found as an
    import would find them, without running anything."""
    parts: dict[str, bytes] = {}
    pending, seen = [home.__name__ for home in homes], set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        pending.extend(_parents(name))
        file, package = _locate(name)
        if file is None:  # built in, a namespace package, or no such module: no code of its own
            continue
        if any(file.is_relative_to(root) for root in _SITE) or _PACKAGES & set(file.parts):
            top = name.partition(".")[0]
            parts[top] = _version(top).encode()
            continue
        if any(file.is_relative_to(root) for root in _STDLIB):
            parts["python"] = sys.version.encode()
            continue
        parts[name] = file.read_bytes()
        if file.suffix == ".py":
            pending.extend(_imported(parts[name], package))
        if name in sys.modules:
            pending.extend(_held(sys.modules[name], _bound(parts[name])))
    return parts


# What each source imports, by its content's digest and package: a race digests the same
# backbone's code once per job, and parsing its modules is most of that work.
_IMPORTS: dict[tuple[bytes, str], tuple[str, ...]] = {}


def _imported(source: bytes, package: str) -> tuple[str, ...]:
    """The absolute names of the modules that the ``import`` statements of ``source`` (a module
    of ``package``) may import: each ``import a.b``'s ``a.b``, each ``from m import n``'s ``m``
    and ``m.n`` (``n`` may be a submodule), relative ones resolved against ``package``."""
    key = (hashlib.blake2b(source, digest_size=16).digest(), package)
    if key not in _IMPORTS:
        _IMPORTS[key] = tuple(_parsed_imports(source, package))
    return _IMPORTS[key]


def _parsed_imports(source: bytes, package: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):  # not Python after all: its bytes alone are the digest
        return []
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            relative = "." * node.level + (node.module or "")
            try:
                base = importlib.util.resolve_name(relative, package) if node.level else relative
            except (ImportError, ValueError):  # beyond the top package: the import fails too
                continue
            names.append(base)
            names.extend(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def _parents(name: str) -> list[str]:
    """The packages above ``name``: ``a`` and ``a.b`` for ``a.b.c``."""
    pieces = name.split(".")
    return [".".join(pieces[:i]) for i in range(1, len(pieces))]


def _locate(name: str) -> tuple[Path | None, str]:
    """The file of module ``name`` (None: none of its own, or not found) and its package."""
    module = sys.modules.get(name)
    if module is not None:
        return _file(module), getattr(module, "__package__", None) or ""
    spec = _spec(name)
    if spec is None or not spec.has_location or not spec.origin:
        return None, ""
    path = Path(spec.origin).resolve()
    package = name if spec.submodule_search_locations is not None else name.rpartition(".")[0]
    return (path if path.is_file() else None), package


def _spec(name: str) -> importlib.machinery.ModuleSpec | None:
    """How an import would find ``name``: asking the import system's finders, with the parent
    package's folders for a submodule, as ``import`` does, but without running any module
    (``importlib.util.find_spec`` would import the parents)."""
    module = sys.modules.get(name)
    if module is not None:
        return getattr(module, "__spec__", None)
    parent = name.rpartition(".")[0]
    path = None
    if parent:
        outer = _spec(parent)
        path = outer.submodule_search_locations if outer is not None else None
        if path is None:  # the parent is no package (or not found): no such submodule
            return None
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        try:
            spec = find(name, path) if find is not None else None
        except Exception:  # a third-party finder's failure: it has no such module to offer
            continue
        if spec is not None:
            return spec
    return None


def _held(module: types.ModuleType, bound: frozenset[str] = frozenset()) -> list[str]:
    """The modules of the modules, classes and functions ``module``'s globals hold (one made by
    ``importlib.import_module`` included, which no import statement names). A package's own
    submodule under its own name is followed only where ``bound`` (the names the module's source
    binds: :func:`_bound`) has that name: the import system sets every imported submodule on its
    package, so following those would make the digest depend on what else the process imported.

    Example:
        >>> import email.mime
        >>> "email.mime" in _held(sys.modules["email"])  # set by the import, not held
        False
        >>> "email.mime" in _held(sys.modules["email"], frozenset({"mime"}))  # bound: held
        True
    """
    return [
        value.__name__ if inspect.ismodule(value) else value.__module__
        for key, value in vars(module).items()
        if (
            inspect.ismodule(value)
            and (value.__name__ != f"{module.__name__}.{key}" or key in bound)
        )
        or inspect.isclass(value)
        or inspect.isfunction(value)
    ]


# The names each source binds at its top level, by its content's digest.
_BOUND: dict[bytes, frozenset[str]] = {}


def _bound(source: bytes) -> frozenset[str]:
    """The names the top-level statements of ``source`` bind: assigned, imported, defined (a
    ``sub = importlib.import_module(".sub", __name__)`` binds ``sub``)."""
    key = hashlib.blake2b(source, digest_size=16).digest()
    if key not in _BOUND:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            tree = ast.Module(body=[], type_ignores=[])
        names: set[str] = set()
        for node in tree.body:
            if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, ast.Import | ast.ImportFrom):
                names.update((a.asname or a.name).partition(".")[0] for a in node.names)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
        _BOUND[key] = frozenset(names)
    return _BOUND[key]


def _file(home: types.ModuleType) -> Path | None:
    file = getattr(home, "__file__", None)
    return Path(file).resolve() if file and Path(file).is_file() else None


@functools.cache
def _version(top: str) -> str:
    """The installed version of the distribution(s) providing package ``top``."""
    names = _distributions().get(top, [])
    versions = [f"{n}=={importlib.metadata.version(n)}" for n in sorted(set(names))]
    if versions:
        return ",".join(versions)
    return f"{top}=={getattr(sys.modules.get(top), '__version__', 'unknown')}"


@functools.cache
def _distributions() -> dict[str, list[str]]:
    """Each importable top-level name's distributions (read once: it scans every installed
    distribution's file list)."""
    return dict(importlib.metadata.packages_distributions())
