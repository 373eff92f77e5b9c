"""Glue for training frameworks. This package imports torch alone; each submodule imports its
framework, and only when it is imported itself (``samplers.integrations.lightning``,
``samplers.integrations.transformers``).

Feedback strategies (``HardMinedSampler``, and any strategy with an ``observe``) must receive
the same feedback on every rank, or the ranks' draws drift apart: :func:`update_across_ranks`
gathers each rank's indices and per-sample losses (``reduction="none"``) and feeds all of them
to the sampler. It is the Accelerate and Fabric helper, and what the Lightning callback calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from samplers.base import Sampler

__all__ = ["find_sampler", "gather_across_ranks", "update_across_ranks"]


def gather_across_ranks(values: torch.Tensor) -> torch.Tensor:
    """Every rank's ``values`` (flattened), concatenated in rank order; sizes may differ.

    Without an initialised process group (or with one rank) it returns ``values`` flattened.
    Every rank must call it (it is a collective), with tensors on the device the backend
    expects (CUDA for NCCL).
    """
    flat = values.reshape(-1)
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flat
    world_size = dist.get_world_size()
    size = torch.tensor([flat.numel()], device=flat.device)
    sizes = [torch.zeros_like(size) for _ in range(world_size)]
    dist.all_gather(sizes, size)
    counts = [int(s) for s in sizes]
    padded = torch.zeros(max(counts), dtype=flat.dtype, device=flat.device)
    padded[: flat.numel()] = flat
    parts = [torch.empty_like(padded) for _ in range(world_size)]
    dist.all_gather(parts, padded)
    return torch.cat([part[:count] for part, count in zip(parts, counts, strict=True)])


def update_across_ranks(sampler: Sampler, indices: torch.Tensor, losses: torch.Tensor) -> None:
    """``sampler.update`` with every rank's ``indices`` and per-sample ``losses``.

    Call it on every rank after each training step, with the batch's dataset indices and the
    unreduced loss (``F.cross_entropy(logits, y, reduction="none")``; detached or not). All
    ranks then hold the same feedback and keep drawing the same global order. A strategy that
    ignores feedback is skipped without any communication.
    """
    if type(sampler).observe is Sampler.observe:
        return
    losses = losses.detach().reshape(-1)
    indices = torch.as_tensor(indices).reshape(-1).to(device=losses.device, dtype=torch.long)
    if indices.numel() != losses.numel():
        raise ValueError(
            f"update_across_ranks: got {indices.numel()} indices but {losses.numel()} losses; "
            "pass one loss per sample (reduction='none')"
        )
    sampler.update(gather_across_ranks(indices), gather_across_ranks(losses))


def find_sampler(loader: object) -> Sampler:
    """The :class:`~samplers.Sampler` a loader draws from, through the wrappers frameworks put
    around it (Accelerate's prepared loaders, Fabric's, Lightning's collections of loaders)."""
    found = _search(loader, depth=0)
    if found is None:
        raise ValueError(
            f"no samplers.Sampler found in {type(loader).__name__}: pass the loader whose "
            "sampler= or batch_sampler= is one (or the sampler itself)"
        )
    return found


def _search(node: object, depth: int) -> Sampler | None:
    if isinstance(node, Sampler):
        return node
    if depth > 4 or node is None or isinstance(node, (str, bytes, torch.Tensor)):
        return None
    children: Iterable[Any]
    if isinstance(node, Mapping):
        children = node.values()
    elif isinstance(node, (list, tuple)):
        children = node
    else:
        children = [getattr(node, name, None) for name in ("batch_sampler", "sampler", "iterables")]
    for child in children:
        found = _search(child, depth + 1)
        if found is not None:
            return found
    return None
