"""Seeds: every random stream is a pure function of the sampler's seed, the epoch and a stream
number, never of the global RNG."""

from __future__ import annotations

import hashlib

import torch

__all__ = ["branch_seed", "epoch_seed", "generator_for", "sub_seed"]

_GOLDEN = 0x9E3779B97F4A7C15
_MASK63 = (1 << 63) - 1


def epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit seed that is a pure function of (seed, epoch), independent of the global RNG."""
    digest = hashlib.blake2b(f"{seed}:{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _MASK63


def sub_seed(seed: int, stream: int) -> int:
    """The 63-bit seed of one stream (a chunk, a class, a pass) of ``seed``."""
    return (seed + (stream + 1) * _GOLDEN) & _MASK63


def branch_seed(seed: int, branch: int) -> int:
    """A 63-bit seed for one branch of ``seed`` whose own streams (``sub_seed``) are split again.

    Hashed: ``sub_seed`` only shifts the seed, so stream ``i`` of stream ``j`` would be stream
    ``j`` of stream ``i``, and two branches numbered with ``sub_seed`` would share streams.
    """
    digest = hashlib.blake2b(f"{seed}/{branch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _MASK63


def generator_for(seed: int, stream: int = 0) -> torch.Generator:
    """A fresh CPU generator for one stream (e.g. one chunk) of a 63-bit seed."""
    return torch.Generator().manual_seed(sub_seed(seed, stream))
