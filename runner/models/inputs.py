"""What a backbone's input needs beyond the run's conversion of a batch: grey images repeated to
the backbone's channels, resizing, and the normalisation its pretrained weights were trained
with; and reading a weights file."""

from __future__ import annotations

import re
import socket
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from runner.errors import UserError


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
    other; the file's tensors under ``skip`` (a pretrained classifier the run replaces) aside.
    Nothing in the file runs: ``torch.load(weights_only=True)`` reads tensors and plain
    containers only, and a file that cannot be read so (damaged, not a weights file, or a
    pickle naming another global: an ``argparse.Namespace``, a numpy scalar, ``os.system``) is
    a :class:`UserError` of two lines naming the file, which never advise loading it unsafely
    or allowlisting the global."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"model.weights={path}: no such file")
    state = _read_state(file, path)
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


SAVE_HINT = (
    "save the state_dict of tensors alone (torch.save(model.state_dict(), path)) or as .safetensors"
)
# What torch's safe unpickler says of a global it does not construct (the name, then whether
# its module is one it blocks outright: os, posix, nt, sys reach the operating system).
_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")
_BLOCKED = re.compile(r"whose module ([\w.]+) is blocked")


def _read_state(file: Path, path: str) -> object:
    """The file's contents, read without running any of it."""
    try:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(file))
        with warnings.catch_warnings():  # torch's note on pickle protocols: not the user's concern
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as error:  # torch and safetensors raise many kinds for a bad file
        refused = _refusal(str(error))
        if refused is not None:  # the pickle names a global: refused before anything ran
            raise UserError(f"model.weights={path}: refused: {refused}\n{SAVE_HINT}") from None
        kind = "a .safetensors file" if file.suffix == ".safetensors" else "a torch.save state dict"
        raise UserError(
            f"model.weights={path}: cannot be read as {kind} ({type(error).__name__}: "
            f"{first_line(error)}); it is damaged or not a weights file\n{SAVE_HINT}"
        ) from None


def _refusal(message: str) -> str | None:
    """Why a safe load refused the file, in our words (torch's own advise allowlisting the
    global or loading unsafely), when its ``message`` names a global; else None."""
    named = _GLOBAL.search(message)
    if named is None:
        return None
    blocked = _BLOCKED.search(message)
    if blocked is not None:
        return (
            f"its pickle names {named.group(1)}, of module {blocked.group(1)}, which a safe load "
            "blocks outright (it reaches the operating system); nothing of it ran"
        )
    return (
        f"its pickle names {named.group(1)}, which a safe load (weights_only=True) does not "
        "construct; nothing of it ran"
    )


def first_line(error: Exception) -> str:
    """What went wrong, in one short phrase: the first line of ``error`` that is neither torch's
    advice about ``weights_only`` (which would run the file's code) nor a pointer to its docs."""
    advice = ("weights_only", "documentation", "file an issue", "Weights only load failed")
    lines = [
        line.strip()
        for line in str(error).splitlines()
        if line.strip() and not any(a in line for a in advice)
    ]
    return lines[0][:160].rstrip(".") if lines else "no message"
