"""Builds that runs prepared together make once: within :func:`reusing_builds`, a run that would
build something exactly as an earlier run there built it gets a copy of that, instead of
building it again.

"Exactly" means the same kind of thing, the same key (the caller's: the config nodes and the
device the build reads) and the same state of torch's CPU random generator before the build
(what initialises weights, so the same seed and the same draws before it). The run then gets
the generator's state the build left, so it goes on as if it had built the thing itself: its
head's initial weights, and everything after, are the same.

A race round's heads on cached features are prepared one after the other in the sweep's process
(:mod:`experiments.race.stacked_jobs`), seed by seed (each after the jobs of its seed that the
basic launcher runs there: cRT, LWS), and then trained as one stack on one copy of their
features. Meanwhile each seed's data (the images read, the long-tailed cut) and its model with
the frozen backbone's features (the backbone built, its weights read and digested, the features
looked up in the cache) are built once: reading the same files again a second later for the
next candidate is what the stack would then throw away. Only the latest build of each kind is
kept, so no other seed's copy is held. Outside a ``reusing_builds()`` block, and for every
block anew, everything is built.

Example:
    >>> import torch
    >>> def draw() -> list[float]:
    ...     return torch.rand(2).tolist()
    >>> with reusing_builds():
    ...     _ = torch.manual_seed(0)
    ...     first = reused("draw", tuple, draw, list)
    ...     after_first = torch.rand(1)
    ...     _ = torch.manual_seed(0)
    ...     second = reused("draw", tuple, lambda: [9.0, 9.0], list)  # not called: reused
    ...     after_second = torch.rand(1)
    >>> first == second, bool(torch.equal(after_first, after_second))
    (True, True)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

T = TypeVar("T")
log = logging.getLogger("runner")

# Within reusing_builds(): (kind, key, generator state before) -> (the value as built, the
# generator's state after). None outside.
_built: dict[tuple[Hashable, ...], tuple[Any, torch.Tensor]] | None = None


@contextmanager
def reusing_builds() -> Iterator[None]:
    """Within, :func:`reused` builds each thing once while it is the latest of its kind (see
    the module's docstring); nested blocks share the outer one's builds. Everything built is
    let go at the end."""
    global _built
    outer = _built
    if outer is None:
        _built = {}
    try:
        yield
    finally:
        _built = outer


def reused(
    kind: str, key: Callable[[], Hashable], build: Callable[[], T], copy: Callable[[T], T]
) -> T:
    """``build()``; within :func:`reusing_builds`, ``copy`` of what ``build`` gave there for
    the same ``kind``, ``key()`` and random state (without calling it again; the random state
    it left restored). ``copy`` gives each run what it may change as its own, so the value
    kept stays as built; what ``build`` raises is not kept."""
    if _built is None:
        return build()
    slot = (kind, key(), torch.get_rng_state().numpy().tobytes())
    held = _built.get(slot)
    if held is None:
        # One of each kind is kept (runs prepared together come seed by seed): what another
        # seed built is let go, not held beside what the runs hold.
        for old in [s for s in _built if s[0] == kind]:
            del _built[old]
        value = build()
        held = _built[slot] = (value, torch.get_rng_state())
    else:
        torch.set_rng_state(held[1])
        log.info("%s: as an earlier run here built it (the same config and random state)", kind)
    return copy(held[0])
