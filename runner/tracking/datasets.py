"""Which data a run saw, as MLflow datasets: one per split, with a digest that changes when the
data, the split or the cut change (:func:`dataset_inputs`), whatever config led to it."""

from __future__ import annotations

import hashlib
import os
import warnings
import weakref
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from runner.config import resolved
from runner.data import LongTailData, Samples
from runner.fingerprint import RUNTIME_KEYS
from runner.train.feature_bank import tensor_bytes

HASH_ROWS = 4096  # samples hashed at a time: a memory-mapped file is read in pieces
CONTEXTS = {"train": "training", "val": "validation", "test": "test"}  # MLflow's context names
# MLflow registers its local file source twice (for the URI schemes "" and "file"), so every
# local path matches both and MLflow warns that it "can be interpreted in multiple ways" before
# taking the last: two lines of noise in every run on a file or folder. Only that pair is quiet.
LOCAL_TWICE = (
    "The specified dataset source can be interpreted in multiple ways: "
    r"LocalArtifactDatasetSource, LocalArtifactDatasetSource\. "
)


# The digests of the in-memory splits hashed last, by the tensors hashed: the runs that a race
# prepares together share one build's tensors (runner.reused_builds), which need not be read
# again for each (a tenth of a second a run on CIFAR's images). Weak references: a split let go
# is not held here, and an object new at a freed address is not taken for it. The runner only
# reads a split's tensors after it builds them, never changing them in place.
RECENT = 8
_Memo = tuple[weakref.ref[torch.Tensor], weakref.ref[torch.Tensor], str]
_known: dict[tuple[int, int], _Memo] = {}


def digest_of(samples: Any, labels: torch.Tensor) -> str:
    """A fingerprint of what one split holds: its labels and its samples' values (read in
    pieces; for a dataset that decodes on demand, the rows it holds and, where the dataset lists
    them, its files' names, sizes and times). The same data gives the same digest, whatever
    config led to it; another cut, split or file gives another. In-memory tensors hashed in
    this process a moment ago give the digest they gave then.

    Example:
        >>> x, y = torch.arange(6.0).reshape(3, 2), torch.tensor([0, 1, 1])
        >>> digest_of(x, y) == digest_of(x.clone(), y.clone()) != digest_of(x + 1, y)
        True
    """
    if not torch.is_tensor(samples):
        return _digest(samples, labels)
    key = (id(samples), id(labels))
    known = _known.get(key)
    if known is not None and known[0]() is samples and known[1]() is labels:
        return known[2]
    digest = _digest(samples, labels)
    _known[key] = (weakref.ref(samples), weakref.ref(labels), digest)
    while len(_known) > RECENT:
        del _known[next(iter(_known))]  # the oldest
    return digest


def _digest(samples: Any, labels: torch.Tensor) -> str:
    digest = hashlib.blake2b(digest_size=16)
    digest.update(labels.numpy().tobytes())
    if torch.is_tensor(samples):
        for start in range(0, len(samples), HASH_ROWS):
            digest.update(tensor_bytes(samples[start : start + HASH_ROWS]))
    elif isinstance(samples, Samples) and not samples.decodes:
        for start in range(0, len(samples), HASH_ROWS):
            rows = range(start, min(start + HASH_ROWS, len(samples)))
            digest.update(tensor_bytes(samples.__getitems__(list(rows))))
    elif isinstance(samples, Samples):
        digest.update(samples.indices.tobytes())
        for path, _ in getattr(samples.base, "samples", [])[:: max(1, len(samples) // 10_000)]:
            stat = os.stat(path)
            digest.update(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def _source(data_cfg: dict[str, Any]) -> Any:
    """Where the data comes from: its file or folder, else the code that makes it."""
    from mlflow.data.code_dataset_source import CodeDatasetSource
    from mlflow.data.dataset_source_registry import resolve_dataset_source

    place = (
        data_cfg.get("path") or data_cfg.get("root") or (data_cfg.get("dataset") or {}).get("root")
    )
    if place:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=LOCAL_TWICE, category=UserWarning)
            return resolve_dataset_source(str(Path(str(place)).expanduser().resolve()))
    return CodeDatasetSource(tags={k: str(v) for k, v in data_cfg.items()})


def dataset_inputs(cfg: DictConfig, data: LongTailData) -> list[Any]:
    """One MLflow dataset input per split (training: the long-tailed cut; validation; test),
    each with the context MLflow's UI shows and a digest of exactly what that split holds."""
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag

    data_cfg = resolved(cfg)["data"]
    for key in RUNTIME_KEYS:  # how the data is fed is not what it is
        if key.startswith("data."):
            data_cfg.pop(key.removeprefix("data."), None)
    source = _source(data_cfg)
    splits = {"train": (data.train_x, data.train_y), "test": (data.test_x, data.test_y)}
    if data.val_x is not None and data.val_y is not None:
        splits["val"] = (data.val_x, data.val_y)
    inputs = []
    for split, (samples, labels) in splits.items():
        # MLflow's own metadata-only dataset; its stub marks ``profile`` abstract, it is not.
        dataset = MetaDataset(  # type: ignore[abstract]
            source,
            name=f"{data.name}-{split}",
            digest=digest_of(samples, labels)[:16],
        )
        context = InputTag(key="mlflow.data.context", value=CONTEXTS[split])
        inputs.append(DatasetInput(dataset=dataset._to_mlflow_entity(), tags=[context]))
    return inputs
