"""One batch on its way to the model: converted (uint8 images standardised per channel) and
augmented (random crop after zero padding, horizontal flip), the same operations whichever way
the batch came (:mod:`runner.train.feed`)."""

from __future__ import annotations

import torch

from runner.data.types import Augment, Normalize


def to_model_input(
    x: torch.Tensor, normalize: Normalize | tuple[torch.Tensor, ...] | None
) -> torch.Tensor:
    """One batch as the model takes it: uint8 images standardised per channel, in float32
    (the same operations, in the same order, whichever path the batch came by)."""
    if normalize is not None:  # sequences, or float32 tensors already on x's device
        mean, std = (
            torch.as_tensor(v, dtype=torch.float32, device=x.device)[:, None, None]
            for v in normalize
        )
        return x.float().div_(255.0).sub_(mean).div_(std)  # (x / 255 - mean) / std, in place
    return x if x.dtype == torch.float32 else x.float()


def augment_batch(
    x: torch.Tensor,
    augment: Augment,
    generator: torch.Generator,
    share: tuple[int, int] = (0, 1),
) -> torch.Tensor:
    """Horizontal flip, then a random crop of the zero-padded image, for a whole batch at once.

    Both are one gather from ``x``: every output pixel reads its source pixel (or is zero, in
    the padding), so neither a flipped nor a padded copy of the batch is made. The random
    numbers are drawn as by flipping and padding step by step (flips, then row and column
    offsets), so a seed gives the same crops either way.

    ``share=(r, W)``: ``x`` is positions ``r, r + W, ...`` of a global batch W times as large
    (one of W data-parallel ranks); the draws are the whole global batch's, from the same
    generator, and ``x`` gets its positions' part, as one process augmenting it all would."""
    rank, ranks = share
    n, channels, h, w = x.shape
    drawn = n * ranks
    pad = augment.crop_padding
    if not augment.flip and pad == 0:
        return x
    if augment.flip:
        flip = (torch.rand(drawn, generator=generator) < 0.5)[rank::ranks]
    else:
        flip = torch.zeros(n, dtype=torch.bool)
    if pad > 0:
        dy = torch.randint(0, 2 * pad + 1, (drawn,), generator=generator)[rank::ranks] - pad
        dx = torch.randint(0, 2 * pad + 1, (drawn,), generator=generator)[rank::ranks] - pad
    else:
        dy = dx = torch.zeros(n, dtype=torch.long)
    device = x.device
    flip, dy, dx = flip.to(device), dy.to(device), dx.to(device)
    rows = dy[:, None] + torch.arange(h, device=device)  # source row of each output row
    columns = dx[:, None] + torch.arange(w, device=device)  # ... of the flipped image
    columns = torch.where(flip[:, None], w - 1 - columns, columns)  # ... of x itself
    inside = ((rows >= 0) & (rows < h))[:, :, None] & ((columns >= 0) & (columns < w))[:, None, :]
    source = rows.clamp(0, h - 1)[:, :, None] * w + columns.clamp(0, w - 1)[:, None, :]
    out = x.reshape(n, channels, h * w).gather(
        2, source.reshape(n, 1, h * w).expand(n, channels, h * w)
    )
    return out.view(n, channels, h, w).mul_(inside[:, None].to(out.dtype))
