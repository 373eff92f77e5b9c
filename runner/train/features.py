"""Frozen backbones (``model.freeze=true``): the backbone runs in eval mode without gradients and
only the head (``model.classifier``) trains.

Without augmentation a frozen backbone maps every sample to the same feature vector in every
epoch, so :func:`freeze_backbone` computes each split's features once and the run trains the head
on them: the loop, the sampler and the evaluation see ``(N, D)`` float features and a model that
is the head alone. The features are cached in ``features.cache_dir``, one file per split, named and
keyed by a digest of what they depend on (:func:`cache_key`): every input batch as the backbone
is fed it (:func:`input_digest`: decoded, transformed, converted; hashed again while extracting,
and not cached when the two readings differ), and the backbone's config, weights, structure and
code and the precision (:func:`backbone_identity`). A file holds its key and
a checksum of its features; it is written to a temporary file and renamed, so a reader finds a
whole file or none, and one that cannot be read, is damaged or holds another key is computed
again (one line says why). Jobs of a sweep that need the same file take turns through a lock
file (the wait is bounded: after :data:`LOCK_WAIT_S` a job computes the features itself), so the
second job reuses what the first computed.

With augmentation on (``trainer.augment=true`` on data that augments) every batch is new, so the
features are not cacheable: the backbone stays in the model, frozen, and runs on every batch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from runner.data import LongTailData
from runner.distributed import is_main
from runner.errors import UserError
from runner.files import write_atomically
from runner.locks import turn
from runner.models import FeatureClassifier
from runner.models.backbones import FrozenBackbone
from runner.models.source import UnreadableCode, code_digest
from runner.train.feed import Feed
from runner.train.settings import MODEL_RUNNER_KEYS
from runner.train.state import autocast

# Of the cache files (3: keyed by the inputs fed); a file of another format is computed again.
# Bump it whenever what extract() computes for the same key changes: the file layout, and also
# how the features are computed (channels-last, autocast, the batch size's effect on the
# numbers), since the key names the inputs and the backbone, not the way they are run.
FORMAT = 3
EXTRACT_BATCH = 256  # samples per backbone forward pass while computing features
LOCK_WAIT_S = 1800.0  # the longest a job waits for another computing the same features
SPLITS = ("train", "val", "test")


@dataclass
class FrozenInputs:
    """What a run on cached features keeps of the model and the data before the swap: the
    logged model takes the stored samples (images) again, not features."""

    backbone: nn.Module
    stored: LongTailData

    def model_for(self, head: FeatureClassifier) -> FeatureClassifier:
        """The frozen backbone and the trained ``head`` (the run's model) as one model."""
        return FeatureClassifier(FrozenBackbone(self.backbone), head.classifier, head.feature_dim)


def augments(data: LongTailData, augment: bool) -> bool:
    """Whether batches of ``data`` are augmented (``trainer.augment`` and data that crops or
    flips): then no two epochs show the backbone the same inputs."""
    spec = data.augment
    return augment and spec is not None and (spec.flip or spec.crop_padding > 0)


def backbone_name(model_cfg: Mapping[str, Any]) -> str:
    """The backbone as a person names it: ``model.name`` where the group has one (timm,
    torchvision), else the class.

    Example:
        >>> backbone_name({"_target_": "runner.models.timm_backbone", "name": "resnet18"})
        'timm_backbone:resnet18'
    """
    target = str(model_cfg["_target_"]).rsplit(".", 1)[-1]
    name = model_cfg.get("name")
    return f"{target}:{name}" if name else target


def freeze_backbone(
    model: FeatureClassifier,
    data: LongTailData,
    model_cfg: Mapping[str, Any],
    augment: bool,
    folder: Path,
    device: torch.device,
) -> tuple[FeatureClassifier, LongTailData, FrozenInputs | None]:
    """The model and data a run with ``model.freeze=true`` trains on: the head on features
    cached in ``folder`` (and what the logged model needs of the rest), or with augmentation
    (``augment``: ``trainer.augment``) the whole model with its backbone frozen (and None).
    ``model_cfg`` is the model group's resolved config, part of the cache key."""
    backbone, head, dim = model.features, model.classifier, model.feature_dim
    if augments(data, augment):
        _say(
            "features: not cached: augmentation is on (trainer.augment=true), so the frozen "
            "backbone computes them for every batch; trainer.augment=false computes them once"
        )
        return FeatureClassifier(FrozenBackbone(backbone), head, dim), data, None
    backbone = backbone.to(device).requires_grad_(False).eval()
    identity = backbone_identity(backbone, model_cfg, device)
    computed: list[tuple[Path | None, torch.Tensor, float]] = []
    reused: list[Path] = []
    features: dict[str, torch.Tensor] = {}
    for split in SPLITS:
        x = getattr(data, f"{split}_x")
        if x is None:
            continue
        feed = Feed(x, device, data.normalize, data.feeding.num_workers)
        if identity is None:  # nothing would tell an edit of the backbone's code: no cache
            features[split], _, seconds = _timed_extract(backbone, feed)
            computed.append((None, features[split], seconds))
            continue
        key = cache_key(input_digest(feed), identity)
        path = folder / f"{data.name}-{split}-{key[:20]}.pt"
        lock = path.with_name(f".{path.name}.lock")
        with turn(lock, LOCK_WAIT_S, "features.cache_dir", f"features {path.name}", _say):
            cached = read_entry(path, key, len(feed))
            if cached is not None:
                features[split] = cached
                reused.append(path)
                continue
            features[split], fed, seconds = _timed_extract(backbone, feed)
            kept = path if cache_key(fed, identity) == key else None
            if kept is not None:
                write_entry(kept, key, features[split])
            else:
                _say(_unstable(split))
            computed.append((kept, features[split], seconds))
    _say(_report(computed, reused, backbone_name(model_cfg)))
    swapped = dataclasses.replace(
        data,
        train_x=features["train"],
        test_x=features["test"],
        val_x=features.get("val"),
        normalize=None,  # the images' standardisation happened before the backbone
        augment=None,
    )
    return FeatureClassifier(nn.Identity(), head, dim), swapped, FrozenInputs(backbone, data)


def backbone_identity(
    backbone: nn.Module, model_cfg: Mapping[str, Any], device: torch.device
) -> dict[str, Any] | None:
    """What a backbone's features depend on besides its inputs: the model's config (less the
    runner's keys), its weights, its structure and code, and the precision; None, after one
    line saying why, when the code of one of its classes cannot be read."""
    try:
        code = code_digest(backbone)
    except UnreadableCode as error:
        _say(
            f"features: not cached: the source of {error} (part of the backbone) cannot be "
            "read, so an edit of it would go unseen; define it in a file to cache them"
        )
        return None
    return {
        "model": {str(k): v for k, v in model_cfg.items() if k not in MODEL_RUNNER_KEYS},
        "weights": weights_digest(backbone),
        "code": code,
        "precision": "bfloat16" if device.type == "cuda" else "float32",
    }


def _timed_extract(backbone: nn.Module, feed: Feed) -> tuple[torch.Tensor, str, float]:
    """:func:`extract`, and the seconds it took."""
    started = time.perf_counter()
    features, fed = extract(backbone, feed)
    return features, fed, time.perf_counter() - started


def _unstable(split: str) -> str:
    return (
        f"features: {split}: not cached: the data gave other inputs when read again (a random "
        "transform in the dataset?), so these features are of one reading; make the dataset's "
        "transform deterministic to cache them"
    )


def _report(
    computed: list[tuple[Path | None, torch.Tensor, float]], reused: list[Path], name: str
) -> str:
    """The run's one line about its features (a computed split not written has no file)."""
    parts = []
    if computed:
        n = sum(len(f) for _, f, _ in computed)
        dim = computed[0][1].shape[1]
        seconds = sum(s for _, _, s in computed)
        files = ", ".join(str(p) for p, _, _ in computed if p is not None) or "not cached"
        parts.append(f"computed {n} x {dim} from {name} in {seconds:.1f} s ({files})")
    if reused:
        parts.append("reused " + ", ".join(str(p) for p in reused))
    return "features: " + "; ".join(parts)


def _say(line: str) -> None:
    if is_main():  # under torchrun, one line for the whole run
        print(line, flush=True)


def weights_digest(module: nn.Module) -> str:
    """A digest of every tensor in ``module``'s state (parameters and buffers, by name)."""
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in module.state_dict().items():
        raw = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(raw.numpy().tobytes())
    return digest.hexdigest()


def cache_key(inputs: str, identity: dict[str, Any]) -> str:
    """The digest a split's cached features are filed under and checked against: the digest of
    the inputs the backbone is fed (:func:`input_digest`) and the backbone's identity
    (:func:`backbone_identity`)."""
    facts = {"format": FORMAT, "inputs": inputs, **identity}
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()


class InputHash:
    """A digest of the batches a backbone is fed, in order: each one's dtype, shape and bytes
    (as on the CPU), every item of every batch."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()  # sha256: the fastest hashlib digest on x86 (SHA-NI)

    def add(self, batch: torch.Tensor) -> None:
        values = batch.detach().cpu().contiguous()
        self._digest.update(f"{values.dtype}{tuple(values.shape)}".encode())
        self._digest.update(values.reshape(-1).view(torch.uint8).numpy().data)

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


def input_digest(feed: Feed) -> str:
    """The digest of every input ``feed`` gives the backbone, read and converted as
    :func:`extract` reads them (decoding and the dataset's transform included, no forward
    pass): what the features are a function of."""
    hashed = InputHash()
    for batch in feed.batches(torch.arange(len(feed)), EXTRACT_BATCH):
        hashed.add(batch)
    return hashed.hexdigest()


def extract(backbone: nn.Module, feed: Feed) -> tuple[torch.Tensor, str]:
    """``backbone``'s features of every sample ``feed`` gives (converted as a training batch
    is), in order, as float32 on the CPU; and the :func:`input_digest` of what it was fed."""
    chunks = []
    hashed = InputHash()
    # Images in channels-last order: convolutions on the CPU run about 1.7x faster so
    # (EfficientNet-Lite0 at 224 pixels); the backbone goes back to the default order after.
    channels_last = False
    try:
        with torch.inference_mode(), autocast(feed.device):
            for batch in feed.batches(torch.arange(len(feed)), EXTRACT_BATCH):
                hashed.add(batch)
                if batch.dim() == 4:
                    if not channels_last:
                        backbone.to(memory_format=torch.channels_last)
                        channels_last = True
                    batch = batch.contiguous(memory_format=torch.channels_last)
                chunks.append(backbone(batch).float().cpu())
    finally:
        if channels_last:
            backbone.to(memory_format=torch.contiguous_format)
    # Concatenated outside inference mode: the head trains on a normal tensor (autograd refuses
    # inference tensors).
    return (torch.cat(chunks) if chunks else torch.empty(0, 0)), hashed.hexdigest()


def _checksum(features: torch.Tensor) -> str:
    return hashlib.blake2b(features.contiguous().numpy().tobytes(), digest_size=16).hexdigest()


def read_entry(path: Path, key: str, rows: int) -> torch.Tensor | None:
    """The features cached at ``path`` when the file is whole and holds ``key``; else None, with
    one line saying why when there was a file."""
    if not path.is_file():
        return None
    try:
        entry = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many kinds for a damaged file
        _say(f"features: {path} is unreadable ({type(error).__name__}); computing it again")
        return None
    problem = None
    if not isinstance(entry, dict) or entry.get("format") != FORMAT:
        problem = "is not a feature cache file of this version"
    elif entry.get("key") != key:
        problem = "holds the features of other data or another backbone (stale)"
    elif not torch.is_tensor(entry.get("features")) or entry["features"].shape[:1] != (rows,):
        problem = f"does not hold {rows} feature vectors"
    elif _checksum(entry["features"]) != entry.get("checksum"):
        problem = "fails its checksum (corrupt)"
    if problem is not None:
        _say(f"features: {path} {problem}; computing it again")
        return None
    features: torch.Tensor = entry["features"]
    return features


def write_entry(path: Path, key: str, features: torch.Tensor) -> None:
    """Write atomically (temporary file, fsync, rename); a folder that cannot take it is a
    :class:`UserError` naming ``features.cache_dir``."""
    entry = {"format": FORMAT, "key": key, "features": features, "checksum": _checksum(features)}
    buffer = io.BytesIO()
    torch.save(entry, buffer)
    try:
        write_atomically(path, buffer.getbuffer())
    except OSError as error:
        raise UserError(
            f"features.cache_dir: cannot write {path} ({error.strerror or error})\n"
            "set features.cache_dir=<a writable folder with room for the features>"
        ) from None
