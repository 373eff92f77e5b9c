"""What a backbone's input needs beyond the run's conversion of a batch: grey images repeated to
the backbone's channels, resizing, and the normalisation its pretrained weights were trained
with; and reading a weights file."""

from __future__ import annotations

import socket
import threading
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F


class InputAdapter(nn.Module):
    """Float images (N, C, H, W) in, the backbone's input out: a grey image repeated to
    ``channels``, resized to ``size`` (bilinear, antialiased; None: as they are), then with
    ``mean``/``std`` standardised per channel (None: as they came). Part of the model, so that the
    logged MLflow model applies it too, and uint8 images stay uint8 until the batch."""

    mean: torch.Tensor | None
    std: torch.Tensor | None

    def __init__(
        self,
        channels: int,
        size: Sequence[int] | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        self.channels = channels
        self.size = tuple(size) if size is not None else None
        stats = mean is not None and std is not None
        shape = (1, channels, 1, 1)
        self.register_buffer("mean", torch.tensor(mean).view(shape) if stats else None)
        self.register_buffer("std", torch.tensor(std).view(shape) if stats else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == 1 and self.channels > 1:
            x = x.expand(-1, self.channels, -1, -1)
        if self.size is not None and tuple(x.shape[-2:]) != self.size:
            x = F.interpolate(x, size=self.size, mode="bilinear", antialias=True)
        if self.mean is not None and self.std is not None:
            x = (x - self.mean) / self.std
        return x


def reachable(host: str, timeout: float = 5.0) -> bool:
    """Whether a TCP connection to ``host``:443 opens within ``timeout`` seconds (name look-up
    included: it runs in a thread that is waited for a bounded time)."""
    opened: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, 443), timeout=timeout).close()
            opened.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout + 1.0)
    return bool(opened)


def load_weights(module: nn.Module, path: str, skip: str | None = None) -> None:
    """Load ``path`` (a state dict saved with ``torch.save``, or a ``.safetensors`` file) into
    ``module`` strictly: every tensor of the module from the file, of the same shape, and no
    other; the file's tensors under ``skip`` (a pretrained classifier the run replaces) aside."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"model.weights={path}: no such file")
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(file))
    else:
        state = torch.load(file, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise ValueError(
            f"model.weights={path} is not a state dict (a mapping of names to tensors)"
        )
    if skip:
        state = {k: v for k, v in state.items() if k != skip and not k.startswith(skip + ".")}
    own = set(module.state_dict())
    missing, unexpected = sorted(own - set(state)), sorted(set(state) - own)
    if missing or unexpected:
        raise ValueError(
            f"model.weights={path} does not fit the model: {len(missing)} tensors missing "
            f"(e.g. {missing[:3]}), {len(unexpected)} unexpected (e.g. {unexpected[:3]})"
        )
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as error:  # shapes that differ
        raise ValueError(f"model.weights={path} does not fit the model: {error}") from None
