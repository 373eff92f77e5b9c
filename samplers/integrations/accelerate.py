"""Accelerate: prepare loaders so that a sampler knows Accelerate deals out its batches.

Imports ``accelerate``; ``pip install 'samplerlab[accelerate]'``.

With several processes, a loader from ``accelerator.prepare`` shards by itself: its
``BatchSamplerShard`` hands process ``r`` the batches ``r, r + W, ...`` of what the loader
reads, and with ``dispatch_batches=True`` its ``DataLoaderDispatcher`` reads on process 0 and
deals the batches out. A sampler read that way must yield the whole global draw on every
process, not shard it again. :func:`prepare` is ``accelerator.prepare`` that then tells every
:class:`~samplers.Sampler` it finds in such a loader (``sampler.loader_shards = True``).
"""

from __future__ import annotations

from typing import Any

from accelerate import Accelerator
from accelerate.data_loader import BatchSamplerShard, DataLoaderDispatcher

from samplers.base import Sampler
from samplers.integrations import find_sampler

__all__ = ["prepare", "tell_sampler"]


def prepare(accelerator: Accelerator, *objects: Any, **options: Any) -> Any:
    """``accelerator.prepare(*objects, **options)``, returned as it returns it; each prepared
    loader that deals out batches and reads a samplers sampler has told it so
    (:func:`tell_sampler`). Models, optimizers and other loaders pass through unchanged."""
    prepared = accelerator.prepare(*objects, **options)
    for item in prepared if isinstance(prepared, tuple) else (prepared,):
        tell_sampler(item)
    return prepared


def tell_sampler(loader: object) -> Sampler | None:
    """If ``loader`` is one of Accelerate's loaders that shard by themselves and reads a
    :class:`~samplers.Sampler`, set that sampler's ``loader_shards`` and return it; else
    ``None`` (a loader of one process, which Accelerate leaves unsharded, or no sampler of
    ours). For loaders prepared outside :func:`prepare`, e.g. by a trainer."""
    deals_out = isinstance(loader, DataLoaderDispatcher) or isinstance(
        getattr(loader, "batch_sampler", None), BatchSamplerShard
    )
    if not deals_out:
        return None
    try:
        sampler = find_sampler(loader)
    except ValueError:  # a loader with a sampler of its own
        return None
    sampler.loader_shards = True
    return sampler
