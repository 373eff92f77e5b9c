"""A frozen backbone's features per input row, shared by every cut of the same images.

A bank is a folder per backbone identity (``<name>-<key[:20]>`` under ``features.cache_dir``,
the key of :func:`runner.train.features.cache_key` of the identity alone) holding shards. A
shard maps row digests to feature rows: the digest of one input row as the backbone is fed it
(:func:`row_digests`: its dtype, shape and bytes), so a row's features are found whatever
split, cut, seed or position it is in. Another imbalance factor, validation size or data seed
of the same images finds every row and computes nothing; a changed image has another digest.

Every write is a new shard, written atomically (a reader finds whole shards or none), holding
its identity key and a checksum of its digests and features. A shard that cannot be read, fails
its checksum or belongs to another identity is skipped and deleted (one line says so), and its
rows are computed again. Jobs take turns on the bank's lock file (:func:`runner.locks.turn`) by
the caller, so a second job of a sweep reads what the first stored.
"""

from __future__ import annotations

import hashlib
import io
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from runner.errors import UserError
from runner.files import while_unchanged, write_atomically

DIGEST_BYTES = 32  # sha256: the fastest hashlib digest on x86 (SHA-NI)


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """``tensor``'s bytes (on the CPU, contiguous, not copied again), for a digest.

    Example:
        >>> bytes(tensor_bytes(torch.tensor([1, 2], dtype=torch.int16)))
        b'\\x01\\x00\\x02\\x00'
    """
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data


def row_digests(batch: torch.Tensor) -> list[bytes]:
    """The digest of each row of ``batch`` (as on the CPU): its dtype, its shape and its bytes.

    Example:
        >>> a, b = row_digests(torch.tensor([[1.0, 2.0], [1.0, 2.0]]))
        >>> a == b, a == row_digests(torch.tensor([[1.0, 2.0]], dtype=torch.float64))[0]
        (True, False)
    """
    values = batch.detach().cpu().contiguous()
    head = f"{values.dtype}{tuple(values.shape[1:])}".encode()
    raw = values.reshape(len(values), math.prod(values.shape[1:])).view(torch.uint8).numpy()
    digests = []
    for row in raw:
        digest = hashlib.sha256(head)
        digest.update(row.data)
        digests.append(digest.digest())
    return digests


def bank_folder(root: Path, name: str, key: str) -> Path:
    """The bank of the backbone named ``name`` with identity key ``key`` under ``root``."""
    return root / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}-{key[:20]}"


class FeatureBank:
    """The shards of one bank folder, read once (:meth:`load`), looked up and added to.

    ``key`` is the identity key every shard must hold; ``say`` writes the one-line notices."""

    def __init__(self, folder: Path, key: str, say: Callable[[str], None]) -> None:
        self.folder = folder
        self.key = key
        self._say = say
        self._rows: dict[bytes, torch.Tensor] = {}

    @property
    def lock(self) -> Path:
        return self.folder / ".lock"

    def load(self) -> None:
        """Read every whole shard of this identity; delete those that are not (one line each).
        Shards are never rewritten (a new one has a new name), so while the folder holds the
        same files the rows read last in this process are taken again, unread
        (:func:`runner.files.while_unchanged`): every job of a sweep loads the bank."""
        paths = sorted(str(path) for path in self.folder.glob("shard-*.pt"))
        slot = ("feature bank", str(self.folder), self.key)
        self._rows = dict(while_unchanged(slot, paths, lambda: self._read_all(paths)))

    def _read_all(self, paths: list[str]) -> dict[bytes, torch.Tensor]:
        rows: dict[bytes, torch.Tensor] = {}
        for path in map(Path, paths):
            shard = self._read(path)
            if shard is None:
                path.unlink(missing_ok=True)
                continue
            digests, features = shard
            for digest, row in zip(digests, features, strict=True):
                rows.setdefault(digest, row)
        return rows

    def _read(self, path: Path) -> tuple[list[bytes], torch.Tensor] | None:
        try:
            entry = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # torch raises many kinds for a damaged file
            self._say(
                f"features: {path} is unreadable ({type(error).__name__}); "
                "its rows are computed again"
            )
            return None
        problem = None
        if not isinstance(entry, dict) or entry.get("key") != self.key:
            problem = "is not a shard of this backbone and format"
        elif not _well_formed(entry.get("digests"), entry.get("features")):
            problem = "does not hold one feature row per digest"
        elif _checksum(entry["digests"], entry["features"]) != entry.get("checksum"):
            problem = "fails its checksum (corrupt)"
        if problem is not None:
            self._say(f"features: {path} {problem}; its rows are computed again")
            return None
        digests = [bytes(d) for d in entry["digests"].numpy()]
        return digests, entry["features"]

    def find(self, digests: Sequence[bytes]) -> tuple[list[int], list[torch.Tensor]]:
        """The positions in ``digests`` whose rows the bank holds, and those rows."""
        found = [i for i, d in enumerate(digests) if d in self._rows]
        return found, [self._rows[digests[i]] for i in found]

    def store(self, digests: Sequence[bytes], features: torch.Tensor) -> None:
        """Add the rows ``features`` under ``digests`` as one new shard (rows it holds already
        left out); a folder that cannot take it is a :class:`UserError` naming
        ``features.cache_dir``."""
        new = {d: i for i, d in enumerate(digests) if d not in self._rows}
        if not new:
            return
        table = torch.tensor([list(d) for d in new], dtype=torch.uint8)
        rows = features[list(new.values())].contiguous()
        entry = {"key": self.key, "digests": table, "features": rows}
        entry["checksum"] = _checksum(table, rows)
        name = hashlib.sha256(table.numpy().tobytes()).hexdigest()[:20]
        path = self.folder / f"shard-{name}.pt"
        buffer = io.BytesIO()
        torch.save(entry, buffer)
        try:
            write_atomically(path, buffer.getbuffer())
        except OSError as error:
            raise UserError(
                f"features.cache_dir: cannot write {path} ({error.strerror or error})\n"
                "set features.cache_dir=<a writable folder with room for the features>"
            ) from None
        for digest, row in zip(new, rows, strict=True):
            self._rows[digest] = row


def _well_formed(digests: object, features: object) -> bool:
    return (
        torch.is_tensor(digests)
        and torch.is_tensor(features)
        and digests.dtype == torch.uint8
        and digests.shape[1:] == (DIGEST_BYTES,)
        and features.dtype == torch.float32
        and features.dim() == 2
        and len(features) == len(digests)
    )


def _checksum(digests: torch.Tensor, features: torch.Tensor) -> str:
    digest = hashlib.blake2b(tensor_bytes(digests), digest_size=16)
    digest.update(tensor_bytes(features))
    return digest.hexdigest()
