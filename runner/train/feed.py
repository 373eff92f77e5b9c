"""Two ways to feed the model, one order.

Data that fits the memory budget is held in memory (on the device when there is one) in its
stored form, uint8 for images, and whole batches are gathered by index and converted there.
Data that does not fit, or ``data.in_memory=false``, is read through a ``DataLoader`` whose
batch sampler is the sampler's epoch cut into batches (a batch sampler's own batches), with
workers, pinned memory on CUDA and decoding on the fly. Both paths take the same indices in the
same order and convert a batch with the same operations (:func:`runner.data.to_model_input`), so
on the CPU a run's metrics do not depend on the path.

The budget: ``data.memory_budget_gb``, or when it is null a quarter of the available memory
(``MemAvailable``), and on CUDA also a quarter of the device's free memory. The in-memory path
is chosen when the training, test and validation samples, in their stored form, fit it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from runner.data import LongTailData, Normalize, to_model_input
from runner.data.samples import SampleError, Samples, default_workers
from runner.errors import UserError
from runner.train.evaluation import predict
from runner.train.feature_bank import tensor_bytes

log = logging.getLogger("runner")

GIB = 2**30
BUDGET_SHARE = 0.25  # of the available host memory, and of the free device memory on CUDA
MATERIALISE_BATCH = 256


def available_memory() -> int:
    """Bytes of host memory available to a new allocation (Linux ``MemAvailable``)."""
    try:
        with open("/proc/meminfo") as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 * GIB


def memory_budget(memory_budget_gb: float | None, device: torch.device) -> int:
    """Bytes the in-memory path may hold (see the module's docstring)."""
    if memory_budget_gb is not None:
        return int(memory_budget_gb * GIB)
    budget = int(available_memory() * BUDGET_SHARE)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget = min(budget, int(free * BUDGET_SHARE))
    return budget


def nbytes(x: Any) -> int:
    """Bytes ``x`` takes in memory in its stored form."""
    if torch.is_tensor(x):
        return x.numel() * x.element_size()
    return x.nbytes


def _splits(data: LongTailData) -> dict[str, Any]:
    return {
        name: getattr(data, name)
        for name in ("train_x", "test_x", "val_x")
        if getattr(data, name) is not None
    }


def _as_is(batch: Any) -> Any:
    """Collate: :meth:`Samples.__getitems__` returns the stacked batch already."""
    return batch


def _user_error(error: SampleError) -> UserError:
    """A sample error, also one re-raised from a DataLoader worker (whose message holds the
    worker's traceback: the original message is its last line)."""
    lines = [line for line in str(error).splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    return UserError(last.split("SampleError: ", 1)[-1])


def materialise(samples: Samples, num_workers: int | None) -> torch.Tensor:
    """Read every sample into one tensor (decoding through a DataLoader's workers)."""
    if not samples.decodes:
        return samples.__getitems__(range(len(samples)))
    out = torch.empty(samples.shape, dtype=samples.dtype)
    plan = [
        list(range(i, min(i + MATERIALISE_BATCH, len(samples))))
        for i in range(0, len(samples), MATERIALISE_BATCH)
    ]
    workers = default_workers(samples) if num_workers is None else num_workers
    loader = DataLoader(samples, batch_sampler=plan, num_workers=workers, collate_fn=_as_is)
    try:
        for chunk, batch in zip(plan, loader, strict=True):
            out[chunk[0] : chunk[-1] + 1] = batch
    except SampleError as error:
        raise _user_error(error) from None
    return out


def place(data: LongTailData, device: torch.device) -> LongTailData:
    """Choose the path (``data.in_memory``, else the budget) and put the samples in its form:
    tensors for the in-memory path, :class:`Samples` for the DataLoader path."""
    feeding, splits = data.feeding, _splits(data)
    need = sum(nbytes(x) for x in splits.values())
    count = sum(len(x) for x in splits.values())
    budget = memory_budget(feeding.memory_budget_gb, device)
    in_memory = feeding.in_memory if feeding.in_memory is not None else need <= budget
    train = splits["train_x"]
    sample_bytes = nbytes(train) // max(1, len(train))
    why = "data.in_memory" if feeding.in_memory is not None else f"budget {budget / GIB:.3g} GiB"
    log.info(
        "data: %d samples, %d bytes each (%s), %.1f MiB in all; %s (%s)",
        count,
        sample_bytes,
        str(train.dtype).removeprefix("torch."),
        need / 2**20,
        "in memory" if in_memory else "through a DataLoader",
        why,
    )
    placed: dict[str, Any]
    if in_memory:
        placed = {
            name: x if torch.is_tensor(x) else materialise(x, feeding.num_workers)
            for name, x in splits.items()
        }
    else:
        placed = {name: Samples(x) if torch.is_tensor(x) else x for name, x in splits.items()}
    return dataclasses.replace(data, **placed)


class Feed:
    """One split's inputs as the model takes them: gathered from memory (a tensor, moved to the
    device) or read through a DataLoader (:class:`Samples`); converted one batch at a time."""

    def __init__(
        self,
        x: torch.Tensor | Samples,
        device: torch.device,
        normalize: Normalize | None = None,
        num_workers: int | None = None,
    ) -> None:
        self.device = device
        self.normalize = (  # on the device once, not copied there every batch
            tuple(torch.tensor(v, dtype=torch.float32, device=device) for v in normalize)
            if normalize is not None
            else None
        )
        self.memory = x.to(device) if torch.is_tensor(x) else None
        self.samples = None if torch.is_tensor(x) else x
        self.num_workers = default_workers(x) if num_workers is None else num_workers

    @property
    def in_memory(self) -> bool:
        return self.memory is not None

    def __len__(self) -> int:
        if self.memory is not None:
            return len(self.memory)
        assert self.samples is not None
        return len(self.samples)

    def content_digest(self) -> bytes | None:
        """A digest of everything the converted rows are a function of, for a split held in
        memory: its bytes, dtype and shape, the standardisation and the device's kind (None for
        one read through a DataLoader, whose rows depend on the dataset's code)."""
        if self.memory is None:
            return None
        shapes = None if self.normalize is None else [tuple(v.shape) for v in self.normalize]
        digest = hashlib.sha256(
            repr((self.memory.dtype, tuple(self.memory.shape), self.device.type, shapes)).encode()
        )
        for values in self.normalize or ():
            digest.update(tensor_bytes(values))
        digest.update(tensor_bytes(self.memory))
        return digest.digest()

    def batches(
        self, order: torch.Tensor, per_batch: int, start: int = 0
    ) -> Iterator[torch.Tensor]:
        """The inputs of batches ``start``, ``start + 1``, ... of ``order`` (CPU indices) cut
        into ``per_batch``, on the device, converted."""
        if self.memory is not None:
            for idx in order.to(self.device, non_blocking=True).split(per_batch)[start:]:
                yield to_model_input(self.memory.index_select(0, idx), self.normalize)
            return
        plan = [b.tolist() for b in order.split(per_batch)[start:]]
        yield from self._read(plan)

    def _read(self, plan: list[Any]) -> Iterator[torch.Tensor]:
        assert self.samples is not None
        loader = DataLoader(
            self.samples,
            batch_sampler=plan,
            num_workers=self.num_workers,
            collate_fn=_as_is,
            pin_memory=self.device.type == "cuda",
        )
        iterator = iter(loader)
        try:
            for x in iterator:
                yield to_model_input(x.to(self.device, non_blocking=True), self.normalize)
        except SampleError as error:
            raise _user_error(error) from None
        finally:
            del iterator  # stops the workers now, also when the epoch stops early

    @torch.no_grad()
    def predict(self, model: torch.nn.Module, batch_size: int) -> np.ndarray:
        """Predicted classes, in eval mode, in chunks of ``batch_size`` (the same on both paths)."""
        if (
            self.memory is not None
            and self.normalize is None
            and self.memory.dtype == torch.float32
        ):
            return predict(model, self.memory, batch_size)
        chunks: Iterator[torch.Tensor]
        if self.memory is not None:  # slices, in the same chunks as the DataLoader's
            chunks = (to_model_input(c, self.normalize) for c in self.memory.split(batch_size))
        else:
            chunks = self.batches(torch.arange(len(self)), batch_size)
        was_training = model.training
        model.eval()
        try:
            preds = [model(x).argmax(1) for x in chunks]
        finally:
            model.train(was_training)
        return torch.cat(preds).cpu().numpy() if preds else np.empty(0, np.int64)
