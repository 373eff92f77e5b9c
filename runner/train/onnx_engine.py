"""``features.engine=onnxruntime``: a frozen backbone's features computed by ONNX Runtime on the
CPU, when it gives the same features as torch.

The backbone (its input adapter and resize included: ``torch.onnx.export``'s exporter writes
the antialiased bilinear resize as ONNX's ``Resize`` with ``antialias=1``, the same formula) is
exported once per backbone identity and input shape, into its feature bank's folder, and run
with ``intra_op_num_threads`` = torch's threads. Every extraction checks it against torch's own
features of its first rows (:data:`runner.train.features.CHECK_ROWS`): :func:`difference`
within :data:`TOLERANCE`, else (or when the backbone cannot be exported, or the session cannot
run them) one line says why and torch computes the rest. Nothing else changes: the rows are stored in the same bank,
since within the tolerance they are the same features (EfficientNet-Lite0 at 224 px, ImageNet
weights: 8.3e-6 on 1,020 CIFAR-10 images, ``python -m scripts.bench_extract``).

Needs the ``onnx`` extra (``onnxruntime``, and ``onnxscript`` for the exporter).
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from runner.errors import UserError
from runner.extras import require
from runner.files import write_atomically

ENGINES = ("torch", "onnxruntime")
# The largest difference from torch's features, relative to their largest magnitude, that
# counts as the same features: float32 kernels that sum in another order differ in the 6th
# digit (8.3e-6 measured on EfficientNet-Lite0 over 1,020 images); 1e-4 is that with a 12x
# margin, and still far below what a head's decision could notice.
TOLERANCE = 1e-4

Forward = Callable[[torch.Tensor], torch.Tensor]


def check_engine(engine: str) -> None:
    """A ``features.engine`` that is not one of :data:`ENGINES`, or ``onnxruntime`` without the
    ``onnx`` extra, is a :class:`UserError` naming it."""
    if engine not in ENGINES:
        raise UserError(
            f"features.engine={engine}: not an engine\nset features.engine=torch or onnxruntime"
        )
    if engine == "onnxruntime":
        for module in ("onnxruntime", "onnxscript"):
            require(module, "onnx", "features.engine=onnxruntime")


def difference(reference: torch.Tensor, other: torch.Tensor) -> float:
    """The largest absolute difference of ``other`` from ``reference``, relative to the largest
    magnitude of ``reference`` (0 when both are zero)."""
    scale = reference.abs().max().item() if reference.numel() else 0.0
    gap = (other - reference).abs().max().item() if reference.numel() else 0.0
    return gap / scale if scale > 0 else (0.0 if gap == 0 else float("inf"))


class OnnxRuntime:
    """The ``onnxruntime`` engine of one extraction: :meth:`choose` on the first rows."""

    def __init__(self, folder: Path, say: Callable[[str], None]) -> None:
        self.folder = folder
        self._say = say
        self._forwards: dict[Path, Forward] = {}  # a session per exported file, made once

    def choose(
        self,
        backbone: nn.Module,
        batch: torch.Tensor,
        reference: torch.Tensor,
        torch_forward: Forward,
    ) -> Forward:
        """ONNX Runtime's forward when it computes ``reference`` (torch's features of ``batch``,
        a few rows) within :data:`TOLERANCE`; else ``torch_forward``, after one line saying
        why."""
        if batch.device.type != "cpu" or batch.dtype != torch.float32:
            self._say(
                "features: features.engine=onnxruntime runs float32 on the CPU; computing "
                f"them with torch ({batch.dtype} on {batch.device.type})"
            )
            return torch_forward
        try:
            forward = self._session(backbone, batch)
            gap = difference(reference.float(), forward(batch))
        except Exception as error:  # the exporter and the runtime raise many kinds
            first = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
            self._say(
                f"features: features.engine=onnxruntime: cannot run the backbone "
                f"({type(error).__name__}: {first}); computing them with torch"
            )
            return torch_forward
        if gap > TOLERANCE:
            self._say(
                f"features: features.engine=onnxruntime differs from torch by {gap:.1e} "
                f"(relative; tolerance {TOLERANCE:.0e}) on the first rows; computing them "
                "with torch"
            )
            return torch_forward
        return forward

    def _session(self, backbone: nn.Module, batch: torch.Tensor) -> Forward:
        """A forward through ONNX Runtime, exported once per input shape (a file that cannot
        be loaded is exported again)."""
        import onnxruntime

        shape = "x".join(str(s) for s in batch.shape[1:])
        path = self.folder / f"backbone-{shape}.onnx"
        if path in self._forwards:
            return self._forwards[path]
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        providers = ["CPUExecutionProvider"]
        session = None
        if path.is_file():
            with contextlib.suppress(Exception):  # damaged: exported again below
                session = onnxruntime.InferenceSession(str(path), options, providers=providers)
        if session is None:
            _export(backbone, batch, path)
            session = onnxruntime.InferenceSession(str(path), options, providers=providers)
        name = session.get_inputs()[0].name

        def forward(x: torch.Tensor) -> torch.Tensor:
            (out,) = session.run(None, {name: x.detach().contiguous().numpy()})
            return torch.from_numpy(out)

        self._forwards[path] = forward
        return forward


def _export(backbone: nn.Module, batch: torch.Tensor, path: Path) -> None:
    """``backbone`` as an ONNX file at ``path`` (written atomically), the batch size dynamic."""
    quiet = io.StringIO()  # the exporter prints its progress; a run shows one line instead
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "onnxscript")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(quiet), torch.inference_mode(False):
            program = torch.onnx.export(
                backbone,
                (batch[:2].clone(),),
                dynamo=True,
                dynamic_shapes=({0: torch.export.Dim("batch")},),
                verbose=False,
            )
        assert program is not None
        write_atomically(path, program.model_proto.SerializeToString())  # over 2 GB: raises
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
