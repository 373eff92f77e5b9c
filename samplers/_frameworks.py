"""How a sampler recognises the training frameworks that consume it, without importing them.

Two frameworks do something to a sampler that it must adapt to, and neither says so to the
sampler itself:

* Accelerate's prepared loaders shard by themselves: ``BatchSamplerShard`` hands process ``r``
  the batches ``r, r + W, ...`` of what it reads, and with ``dispatch_batches=True`` the
  ``DataLoaderDispatcher`` reads on process 0 and deals the batches out. A sampler read by
  either must yield the global draw, or the processes would share a shard of a shard.
* torchdata's ``StatefulDataLoader`` with workers saves the sampler's state when it hands a
  batch's indices to a worker, ahead of the training loop, and returns that saved state when
  the loop later asks for a checkpoint. The feedback a strategy received in between would be
  missing from it.

Both are recognised by who is calling: a frame of those classes' methods a few frames up the
stack, or a caller in torchdata's ``stateful_dataloader`` package. Nothing is imported: a
framework that is not loaded cannot be the caller.
"""

from __future__ import annotations

import sys
from types import CodeType, FrameType

__all__ = ["called_by_stateful_loader", "read_by_sharding_loader"]

#: Classes that shard what they read from a sampler across processes: (module, class name).
SHARDING_READERS = (
    ("accelerate.data_loader", "BatchSamplerShard"),
    ("accelerate.data_loader", "DataLoaderDispatcher"),
)
#: How far up the stack such a reader may sit: ``BatchSamplerShard`` reads an index sampler
#: through the DataLoader's ``BatchSampler`` (two frames up); the dispatcher through the whole
#: DataLoader iterator (up to eight, when it starts its workers).
_DEPTH = 10
_loaded: tuple[str, ...] = ()
_codes: frozenset[CodeType] = frozenset()


def _reader_codes() -> frozenset[CodeType]:
    """Code objects of every method of the sharding readers whose modules are loaded (looked
    up again only when another of those modules has been imported)."""
    global _loaded, _codes
    loaded = tuple(module for module, _ in SHARDING_READERS if module in sys.modules)
    if loaded != _loaded:
        found: set[CodeType] = set()
        for module_name, class_name in SHARDING_READERS:
            if module_name in sys.modules:
                found |= _methods(getattr(sys.modules[module_name], class_name))
        _loaded, _codes = loaded, frozenset(found)
    return _codes


def _methods(cls: type) -> set[CodeType]:
    codes: set[CodeType] = set()
    for klass in [cls, *cls.__subclasses__()]:
        for value in vars(klass).values():
            function = value.fget if isinstance(value, property) else value
            code = getattr(function, "__code__", None)
            if isinstance(code, CodeType):
                codes.add(code)
    return codes


def _callers(skip: int) -> FrameType | None:
    """The frame ``skip`` levels above the caller of the function that calls this one."""
    try:
        return sys._getframe(skip + 2)
    except ValueError:  # the stack is shallower than that
        return None


def read_by_sharding_loader() -> bool:
    """Whether the sampler method calling this was called by a loader that shards by itself."""
    codes = _reader_codes()
    if not codes:
        return False
    frame = _callers(1)
    for _ in range(_DEPTH):
        if frame is None:
            return False
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


def called_by_stateful_loader() -> bool:
    """Whether the sampler method calling this was called by torchdata's StatefulDataLoader."""
    frame = _callers(1)
    name = frame.f_globals.get("__name__", "") if frame is not None else ""
    return isinstance(name, str) and name.startswith("torchdata.stateful_dataloader")
