"""Data-parallel training under torchrun: one process per device, one run.

The contract (``torchrun --nproc_per_node=W -m runner ...``; docs/scaling.md):

* A process started by torchrun with ``WORLD_SIZE`` > 1 joins a process group (nccl on CUDA,
  where rank ``r`` trains on ``cuda:LOCAL_RANK``; gloo on the CPU). Any other process creates no
  group and runs exactly as a single process always did.
* ``trainer.batch_size`` is the global batch: every step trains on the same global batch as one
  process would, rank ``r`` on its positions ``r, r + W, ...`` (``batch_size / W`` samples), and
  DistributedDataParallel averages the gradients, so a step equals one process's step on the
  whole batch (BatchNorm statistics aside: :func:`data_parallel`). A batch size that ``W`` does
  not divide is a :class:`runner.errors.UserError` before any training.
* Feedback (``sampler.update``) gets the epoch's indices and losses of every rank in the global
  order, so every rank holds the same sampler state and draws the same next epoch.
* Rank 0 alone talks to MLflow and writes checkpoints and figures; it decides (resume, run id)
  and the others receive its decisions (:func:`from_main`). Every rank evaluates the whole test
  set with the same parameters, so evaluation needs no collective and the ranks stay in step.
* A signal (torchrun forwards Ctrl-C and SIGTERM to every rank) stops every rank at the same
  batch boundary: the ranks vote at each one (:func:`_vote`). A vote or a training collective
  that fails means a peer died: the run ends FAILED, not KILLED.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from runner.errors import UserError
from runner.signals import agreeing
from samplers import Sampler

T = TypeVar("T")

# Votes and broadcasts of Python objects run on the CPU (gloo) whatever the training backend:
# they never wait for a GPU's queue.
_control: list[dist.ProcessGroup | None] = []


def launched() -> bool:
    """Whether torchrun started this process as one of several ranks."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def command() -> str:
    """The command that started this run, to start it again (e.g. with ``resume=``)."""
    if not launched():
        return "python -m runner"
    if os.environ.get("LOCAL_WORLD_SIZE") == os.environ["WORLD_SIZE"]:
        return f"torchrun --standalone --nproc_per_node={os.environ['WORLD_SIZE']} -m runner"
    return "torchrun <the same options> -m runner"


def _joined() -> bool:
    return dist.is_available() and dist.is_initialized()


def backend() -> str | None:
    """The process group's backend (nccl, gloo), or None in a single process."""
    return str(dist.get_backend()) if _joined() else None


def is_main() -> bool:
    """Rank 0, or a single process: the one that tracks and writes files."""
    return not _joined() or dist.get_rank() == 0


@contextlib.contextmanager
def process_group(device: str) -> Iterator[None]:
    """Join torchrun's process group for the block (nothing without torchrun).

    ``device`` is ``trainer.device``: nccl when it resolves to CUDA (``cuda:LOCAL_RANK`` becomes
    the current device), gloo otherwise. Ranks other than 0 log warnings only and print nothing
    to stdout (their errors still reach stderr). The group is destroyed at the block's end, also
    after an error, so the process exits cleanly.
    """
    if not launched():
        yield
        return
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    # Ranks must notice a dead peer, not wait torch's default 30 minutes on a collective.
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(minutes=5))
    _control.append(cast(dist.ProcessGroup, dist.new_group(backend="gloo")) if cuda else None)
    try:
        with contextlib.ExitStack() as quiet, agreeing(_vote):
            if dist.get_rank() != 0:  # one console report, rank 0's
                logging.getLogger("runner").setLevel(logging.WARNING)
                devnull = quiet.enter_context(open(os.devnull, "w"))
                quiet.enter_context(contextlib.redirect_stdout(devnull))
            yield
    finally:
        _control.pop()
        dist.destroy_process_group()


def _vote(signum: int) -> int:
    """At a batch boundary, every rank says which signal it holds (0: none); all stop on the
    highest. A peer that died makes this collective fail, which fails the run."""
    held = torch.tensor([signum])
    dist.all_reduce(held, dist.ReduceOp.MAX, group=_control[-1])
    return int(held)


def from_main(compute: Callable[[], T], portable: Callable[[T], object] = lambda v: v) -> T:
    """``compute()`` on rank 0 alone; every other rank receives ``portable(result)`` (what can
    be pickled of it) and returns that. An exception on rank 0 is raised on every rank. In a
    single process, just ``compute()``."""
    if not _joined():
        return compute()
    outcome: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            result = compute()
            outcome[0] = (True, portable(result))
        except Exception as error:
            outcome[0] = (False, error)
    dist.broadcast_object_list(outcome, src=0, group=_control[-1])
    ok, value = outcome[0]
    if not ok:
        raise value
    return result if dist.get_rank() == 0 else cast(T, value)


def check_batch_size(batch_size: int) -> None:
    """``trainer.batch_size`` is the global batch: every rank must take an equal share."""
    if not _joined():
        return
    world = dist.get_world_size()
    if batch_size % world:
        raise UserError(
            f"trainer.batch_size={batch_size} is the global batch, split over {world} processes, "
            f"which it does not divide; use a multiple of {world}"
        )


class DataParallel:
    """This rank's part of data-parallel training: the DistributedDataParallel wrapper that the
    training pass calls, its share of every global batch, and the collectives that give every
    rank the whole epoch's feedback."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.device = device
        if (
            device.type == "cuda"
        ):  # one BatchNorm over the global batch; gloo cannot (docs/scaling.md)
            # In place (the layers are children; no model here is a bare BatchNorm), keeping the
            # parameters the optimizer holds.
            torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        ids = [torch.cuda.current_device()] if device.type == "cuda" else None
        self.module = DistributedDataParallel(model, device_ids=ids)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def order(self, sampler: Sampler) -> torch.Tensor:
        """This rank's indices of the epoch, batch by batch: its positions ``r, r + W, ...`` of
        every global batch. An index sampler shards the epoch that way itself (positions
        ``r, r + W, ...`` of the draw, padded to a multiple of W); a batch sampler's batches,
        which it would hand out whole, are split here column by column."""
        if sampler.batch_size:
            return sampler.global_indices()[:, self.rank :: self.world_size]
        return sampler.epoch_indices()

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        """Every rank's equally long 1-D ``local`` in the global order (rank ``r``'s item ``j``
        at position ``j * W + r``), on ``local``'s device."""
        on = local.to(self.device)
        parts = [torch.empty_like(on) for _ in range(self.world_size)]
        dist.all_gather(parts, on)
        return torch.stack(parts, dim=1).reshape(-1).to(local.device)

    def total(self, local: torch.Tensor) -> torch.Tensor:
        """The sum of ``local`` over the ranks."""
        summed = local.to(self.device).clone()
        dist.all_reduce(summed)
        return summed.to(local.device)


def data_parallel(model: torch.nn.Module, device: torch.device) -> DataParallel | None:
    """A :class:`DataParallel` around ``model`` under torchrun, else None. On CUDA BatchNorm
    layers become SyncBatchNorm (statistics over the global batch, as in one process); on the
    CPU torch's SyncBatchNorm does not run (it refuses CPU tensors), so each rank normalises
    with the statistics of its own share of the batch."""
    if not _joined():
        return None
    return DataParallel(model, device)
