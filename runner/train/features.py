"""Frozen backbones (``model.freeze=true``): the backbone runs in eval mode without gradients and
only the head (``model.classifier``) trains.

Without augmentation a frozen backbone maps every sample to the same feature vector in every
epoch, so :func:`freeze_backbone` computes each sample's features once and the run trains the
head on them: the loop, the sampler and the evaluation see ``(N, D)`` float features and a model
that is the head alone. The features are kept per input row in a bank in
``features.cache_dir`` (:mod:`runner.train.feature_bank`): a bank per backbone identity
(:func:`backbone_identity`: its config, weights, structure and code, and the precision; filed
under :func:`cache_key`), a row per input as the backbone is fed it (decoded, transformed,
converted; its dtype, shape and bytes digested). A split looks up each row's digest and computes
only the rows the bank lacks, so every cut of the same images (another imbalance factor,
validation size, seed) reuses them. The rows computed are hashed again while extracting and not
stored when the two readings differ. Jobs of a sweep take turns on the bank through a lock file
(the wait is bounded: after :data:`LOCK_WAIT_S` without progress a job computes the features
itself), so the second job reuses what the first computed.

With augmentation on (``trainer.augment=true`` on data that augments) every batch is new, so the
features are not cacheable: the backbone stays in the model, frozen, and runs on every batch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from runner.data import LongTailData
from runner.distributed import is_main
from runner.locks import beat, turn
from runner.models import FeatureClassifier
from runner.models.backbones import FrozenBackbone, names_a_file
from runner.models.source import UnreadableCode, code_digest
from runner.train.feature_bank import FeatureBank, bank_folder, row_digests, tensor_bytes
from runner.train.feed import Feed
from runner.train.heap import kept_heap
from runner.train.onnx_engine import Forward, OnnxRuntime
from runner.train.settings import MODEL_RUNNER_KEYS
from runner.train.state import autocast

# Of the feature banks (4: a row per input, shared by every split; 3 was a file per split,
# no longer read). Bump it whenever what extract() computes for the same key changes: the
# layout, and also how the features are computed (channels-last, autocast, anything that
# changes a row's numbers), since the key names the backbone, not the way it is run.
FORMAT = 4
EXTRACT_BATCH = 256  # samples per backbone forward pass while computing features
CHECK_ROWS = 16  # rows torch computes to check another engine (features.engine) against
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
    engine: str = "torch",
) -> tuple[FeatureClassifier, LongTailData, FrozenInputs | None]:
    """The model and data a run with ``model.freeze=true`` trains on: the head on features
    cached in ``folder`` (and what the logged model needs of the rest), or with augmentation
    (``augment``: ``trainer.augment``) the whole model with its backbone frozen (and None).
    ``model_cfg`` is the model group's resolved config, part of the cache key. ``engine``
    (``features.engine``): ``onnxruntime`` computes the features to be cached with ONNX
    Runtime where it agrees with torch (:mod:`runner.train.onnx_engine`), else torch."""
    backbone, head, dim = model.features, model.classifier, model.feature_dim
    if augments(data, augment):
        _say(
            "features: not cached: augmentation is on (trainer.augment=true), so the frozen "
            "backbone computes them for every batch; trainer.augment=false computes them once"
        )
        return FeatureClassifier(FrozenBackbone(backbone), head, dim), data, None
    backbone = backbone.to(device).requires_grad_(False).eval()
    feeds = {
        split: Feed(x, device, data.normalize, data.feeding.num_workers)
        for split in SPLITS
        if (x := getattr(data, f"{split}_x")) is not None
    }
    name = backbone_name(model_cfg)
    identity = backbone_identity(backbone, model_cfg, device)
    tally = Tally(name)
    if identity is None:  # nothing would tell an edit of the backbone's code: no cache
        features = {s: tally.computed(*_timed_extract(backbone, f)) for s, f in feeds.items()}
    else:
        key = cache_key(identity)
        bank = FeatureBank(bank_folder(folder, name, key), key, _say)
        runtime = OnnxRuntime(bank.folder, _say) if engine == "onnxruntime" else None
        digests = {split: feed_digests(feed) for split, feed in feeds.items()}
        with turn(
            bank.lock, LOCK_WAIT_S, "features.cache_dir", f"features {bank.folder.name}", _say
        ):
            bank.load()
            features = {
                split: _banked(backbone, feed, digests[split], bank, tally, split, runtime)
                for split, feed in feeds.items()
            }
    _say(tally.line())
    swapped = dataclasses.replace(
        data,
        train_x=features["train"],
        test_x=features["test"],
        val_x=features.get("val"),
        normalize=None,  # the images' standardisation happened before the backbone
        augment=None,
    )
    return FeatureClassifier(nn.Identity(), head, dim), swapped, FrozenInputs(backbone, data)


def _banked(
    backbone: nn.Module,
    feed: Feed,
    digests: list[bytes],
    bank: FeatureBank,
    tally: Tally,
    split: str,
    engine: OnnxRuntime | None,
) -> torch.Tensor:
    """The features of every row of ``feed`` (whose rows have ``digests``): those ``bank``
    holds, the others computed and stored, unless a row's second reading differs (one line)."""
    found, rows = bank.find(digests)
    tally.reused(len(found), bank.folder)
    if rows and len(rows) == len(digests):  # every row banked: in their order already
        return torch.stack(rows)
    missing = torch.ones(len(digests), dtype=torch.bool)
    missing[found] = False
    order = missing.nonzero().flatten()
    computed = torch.empty(0, 0)
    if len(order):
        computed, reread, seconds = _timed_extract(
            backbone, feed, order, lambda: beat(bank.lock), engine
        )
        stable = [i for i, d in enumerate(reread) if d == digests[order[i]]]
        bank.store([reread[i] for i in stable], computed[stable])
        if len(stable) < len(order):
            _say(_unstable(split))
        tally.computed(computed, reread, seconds, bank.folder if stable else None)
    width = rows[0].shape[0] if rows else computed.shape[1]
    out = torch.empty(len(digests), width)
    if rows:
        out[found] = torch.stack(rows)
    if len(order):
        out[order] = computed
    return out


def backbone_identity(
    backbone: nn.Module, model_cfg: Mapping[str, Any], device: torch.device
) -> dict[str, Any] | None:
    """What a backbone's features depend on besides its inputs: the model's config (less the
    runner's keys, and a weights file by its content, not its path), its weights, its structure
    and code, and the precision; None, after one line saying why, when the code of one of its
    classes cannot be read."""
    try:
        code = code_digest(backbone)
    except UnreadableCode as error:
        _say(
            f"features: not cached: the source of {error} (part of the backbone) cannot be "
            "read, so an edit of it would go unseen; define it in a file to cache them"
        )
        return None
    settings = {str(k): v for k, v in model_cfg.items() if k not in MODEL_RUNNER_KEYS}
    if isinstance(settings.get("weights"), str) and names_a_file(settings["weights"]):
        # Where the file lies is no part of what the features are; its content is digested
        # below with the rest of the backbone's state.
        settings["weights"] = "a file"
    return {
        "model": settings,
        "weights": weights_digest(backbone),
        "code": code,
        "precision": "bfloat16" if device.type == "cuda" else "float32",
    }


def _timed_extract(
    backbone: nn.Module,
    feed: Feed,
    order: torch.Tensor | None = None,
    on_batch: Callable[[], None] = lambda: None,
    engine: OnnxRuntime | None = None,
) -> tuple[torch.Tensor, list[bytes], float]:
    """:func:`extract`, and the seconds it took."""
    started = time.perf_counter()
    features, digests = extract(backbone, feed, order, on_batch, engine)
    return features, digests, time.perf_counter() - started


def _unstable(split: str) -> str:
    return (
        f"features: {split}: not cached: the data gave other inputs when read again (a random "
        "transform in the dataset?), so these features are of one reading; make the dataset's "
        "transform deterministic to cache them"
    )


class Tally:
    """The rows a run computed and reused, for its one line about its features."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.rows = {"computed": 0, "reused": 0}
        self.width = 0
        self.seconds = 0.0
        self.banks: set[Path] = set()

    def reused(self, rows: int, bank: Path) -> None:
        self.rows["reused"] += rows
        if rows:
            self.banks.add(bank)

    def computed(
        self,
        features: torch.Tensor,
        digests: list[bytes],
        seconds: float,
        bank: Path | None = None,
    ) -> torch.Tensor:
        """Count ``features`` (of the rows ``digests``), computed in ``seconds``, stored in
        ``bank`` (None: not stored); returns them."""
        if len(digests):
            self.rows["computed"] += len(digests)
            self.width = features.shape[1]
            self.seconds += seconds
        if bank is not None:
            self.banks.add(bank)
        return features

    def line(self) -> str:
        """``features: computed N x D from NAME in S s; reused M rows (of T; in BANK)``, the
        parts that apply."""
        computed, reused = self.rows["computed"], self.rows["reused"]
        parts = []
        if computed:
            parts.append(
                f"computed {computed} x {self.width} from {self.name} in {self.seconds:.1f} s"
            )
        if reused or not computed:
            parts.append(f"reused {reused} rows")
        where = ", ".join(str(b) for b in sorted(self.banks)) or "not cached"
        return f"features: {'; '.join(parts)} (of {computed + reused}; {where})"


def _say(line: str) -> None:
    if is_main():  # under torchrun, one line for the whole run
        print(line, flush=True)


def weights_digest(module: nn.Module) -> str:
    """A digest of every tensor in ``module``'s state (parameters and buffers, by name)."""
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in module.state_dict().items():
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor_bytes(tensor))
    return digest.hexdigest()


def cache_key(identity: dict[str, Any]) -> str:
    """The digest a backbone's feature bank is filed under and its shards are checked against:
    the backbone's identity (:func:`backbone_identity`) and :data:`FORMAT`."""
    facts = {"format": FORMAT, **identity}
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()


# Row digests by the content they are computed from (:meth:`Feed.content_digest`): a sweep's
# jobs feed the same images again, and converting and digesting every row is most of what
# finding their features costs. The last few splits digested are held.
_FED: dict[bytes, tuple[bytes, ...]] = {}
FED_HELD = 3


def feed_digests(feed: Feed) -> list[bytes]:
    """The :func:`row_digests` of every input ``feed`` gives the backbone, read and converted as
    :func:`extract` reads them (decoding and the dataset's transform included, no forward
    pass): what each row's features are a function of. For a split held in memory they are
    taken from this process's last digests of the same content, if any."""
    content = feed.content_digest()
    if content is not None and content in _FED:
        return list(_FED[content])
    digests: list[bytes] = []
    for batch in feed.batches(torch.arange(len(feed)), EXTRACT_BATCH):
        digests += row_digests(batch)
    if content is not None:
        while len(_FED) >= FED_HELD:
            del _FED[next(iter(_FED))]
        _FED[content] = tuple(digests)
    return digests


def extract(
    backbone: nn.Module,
    feed: Feed,
    order: torch.Tensor | None = None,
    on_batch: Callable[[], None] = lambda: None,
    engine: OnnxRuntime | None = None,
    keep_heap: bool = True,
) -> tuple[torch.Tensor, list[bytes]]:
    """``backbone``'s features of the rows ``order`` (default: all) of ``feed`` (converted as a
    training batch is), in that order, as float32 on the CPU; and the :func:`row_digests` of
    what it was fed. ``on_batch`` runs after each batch (a lock's beat). ``engine`` computes
    the rows after the first :data:`CHECK_ROWS` when it agrees with torch on those. With ``keep_heap``,
    large allocations are kept between batches (:func:`runner.train.heap.kept_heap`): the same
    numbers, fewer page faults."""
    order = torch.arange(len(feed)) if order is None else order
    chunks: list[torch.Tensor] = []
    digests: list[bytes] = []
    # Images in channels-last order: convolutions on the CPU run about 1.7x faster so
    # (EfficientNet-Lite0 at 224 pixels); the backbone goes back to the default order after.
    channels_last = False

    def torch_forward(batch: torch.Tensor) -> torch.Tensor:
        nonlocal channels_last
        if batch.dim() == 4:
            if not channels_last:
                backbone.to(memory_format=torch.channels_last)
                channels_last = True
            batch = batch.contiguous(memory_format=torch.channels_last)
        out: torch.Tensor = backbone(batch)
        return out

    forward: Forward = torch_forward
    try:
        with kept_heap(keep_heap), torch.inference_mode(), autocast(feed.device):
            for batch in feed.batches(order, EXTRACT_BATCH):
                digests += row_digests(batch)
                if engine is not None and not chunks:  # torch's first rows judge the engine
                    probe = batch[:CHECK_ROWS]
                    chunks.append(torch_forward(probe).float().cpu())
                    forward = engine.choose(backbone, probe, chunks[0], torch_forward)
                    batch = batch[CHECK_ROWS:]
                if len(batch):
                    chunks.append(forward(batch).float().cpu())
                on_batch()
    finally:
        if channels_last:
            backbone.to(memory_format=torch.contiguous_format)
    # Concatenated outside inference mode: the head trains on a normal tensor (autograd refuses
    # inference tensors).
    return (torch.cat(chunks) if chunks else torch.empty(0, 0)), digests
