"""Feedback state kept in place: the tensors a strategy learns from training stay the same
objects, so a state dict taken earlier (which holds them) and the sampler agree."""

from __future__ import annotations

import torch

__all__ = ["keep_in_place", "restore_in_place"]


def keep_in_place(owner: object, name: str, tensor: torch.Tensor) -> None:
    """Put ``owner.<name>``'s values into ``tensor`` and make it ``owner.<name>`` again, if the
    strategy replaced it by a tensor of the same shape and dtype."""
    new = getattr(owner, name)
    if new is not tensor and _same_layout(new, tensor):
        tensor.copy_(new)
        setattr(owner, name, tensor)


def restore_in_place(owner: object, name: str, saved: torch.Tensor) -> None:
    """Copy ``saved`` into ``owner.<name>`` if both have the same shape, dtype and device, else
    make a copy of ``saved`` the attribute."""
    current = getattr(owner, name)
    if _same_layout(saved, current):
        current.copy_(saved)
    else:
        setattr(owner, name, saved.clone())


def _same_layout(a: object, b: object) -> bool:
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.shape == b.shape
        and a.dtype == b.dtype
        and a.device == b.device
    )
