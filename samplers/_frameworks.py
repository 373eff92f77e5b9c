"""What a sampler reads of a training framework's state, without importing the framework.

A sampler is told who shards its draw (:attr:`samplers.Sampler.loader_shards`, which
``samplers.integrations.accelerate.prepare`` sets); nothing here changes what it yields. What it
cannot be told is that nobody told it: ``accelerator.prepare`` called directly hands process
``r`` the batches ``r, r + W, ...`` of what it reads, so a sampler that also shards itself would
give every process a shard of a shard, a quarter of the epoch on two processes, silently.
Accelerate records that it runs several processes in its process-wide state, which its public
``accelerate.state.is_initialized()`` reports; the sampler refuses to shard itself under it
unless its rank and world size were given. ``tests/test_frameworks.py`` runs that refusal under
the installed Accelerate, so a release that changes those names fails there.
"""

from __future__ import annotations

import sys

__all__ = ["accelerate_processes", "check_not_sharded_twice"]


def accelerate_processes() -> int:
    """The number of processes an ``Accelerator`` of this process runs; 1 when Accelerate is
    not imported or no ``Accelerator`` has been created (reading it creates nothing)."""
    state = sys.modules.get("accelerate.state")
    if state is None or not state.is_initialized():
        return 1
    return int(state.AcceleratorState().num_processes)


def check_not_sharded_twice(sampler: str, placed: bool) -> None:
    """Refuse, in one line naming the fix, to let a sampler shard itself where Accelerate runs
    several processes and nobody told the sampler that its loader shards. ``sampler``: its
    class name; ``placed``: its rank and world size were given (the user's own sharding)."""
    processes = accelerate_processes()
    if processes > 1 and not placed:
        raise ValueError(
            f"{sampler} is read in one of {processes} processes that Accelerate runs, without "
            "being told who shards: a loader from accelerator.prepare deals out batches of what "
            "it reads, so this sampler must yield the whole draw; prepare the loader with "
            "samplers.integrations.accelerate.prepare(accelerator, ...) (the HF Trainer: "
            "SamplerTrainerMixin), or, for a loader Accelerate does not prepare, pass rank= and "
            "world_size= to shard it yourself"
        )
