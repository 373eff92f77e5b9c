"""Shared training prefixes: the jobs of a sweep that train alike up to an epoch train it once.

A run declares its prefix (:func:`declared_prefix`): the config it trains exactly like, and up
to which epoch. Until its switch, ``sampler=deferred`` (DRS) draws the uniform order and
``loss=drw`` is plain cross-entropy; cRT's and LWS's first stage and tau-normalisation's
training are the cross-entropy run's, but for the last epoch (which logs ``stage1/*`` or
tau-normalises). So all of them share the training of uniform sampling with cross-entropy (same
data, model, trainer recipe and seed) up to their own epoch; a plain CE run shares all of it.

Jobs of one sweep with the same prefix and seed meet in one cache entry
(``<prefixes.cache_dir>/<sweep parent run>/<prefix>/seed-<seed>/``). A job writes down the
epoch it wants (for the whole prefix, every seed: later seeds' runs save it as they pass it),
then either forks from a snapshot at exactly that epoch, or takes the entry's lock, forks from
the latest snapshot before it, trains on to its epoch (saving a snapshot at each epoch another
job wants on the way) and lets go; a job waits for the holder while the holder makes progress
(:func:`runner.locks.turn`). A snapshot is the checkpoint the run would have written at that
epoch, with the metrics and tables logged until then, so that a forked run's record and
results are bit-identical on the CPU to training it alone. The sweep's entries are removed when
it finishes (:func:`remove_sweep_cache`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from runner import cache_dirs
from runner.config import CONF
from runner.fingerprint import config_key
from runner.locks import beat, turn
from runner.train.fit import fit
from runner.train.losses import ClassWeightedLoss
from runner.train.recorder import Recorder
from runner.train.run import Parts, RunContext
from runner.train.stages import stage_for
from runner.train.state import load_checkpoint, save_checkpoint, total_epochs
from samplers import DeferredSampler, Sampler, UniformSampler

log = logging.getLogger("runner")

WAIT_S = 600.0  # how long a job waits on a holder that makes no progress (an epoch), then trains
FORKED_TAG = "prefix.forked_epochs"  # the epochs a run took from another job's snapshot
ALL = sys.maxsize  # a part of the run that trains like the prefix throughout


@dataclass(frozen=True)
class Prefix:
    """A run trains its first ``epochs`` epochs exactly like the config fingerprinted
    ``family`` (seed left out) with seed ``seed``."""

    family: str
    seed: int
    epochs: int


def declared_prefix(cfg: DictConfig, parts: Parts) -> Prefix | None:
    """The prefix ``cfg`` (built as ``parts``) trains like; None when it shares no epoch with
    the uniform cross-entropy run (another sampler or loss from the start, torchrun)."""
    trainer, sampler = parts.trainer, parts.sampler
    if parts.state.parallel is not None or sampler.world_size != 1:
        return None
    until = [_sampler_until(sampler), _loss_until(parts.loss_fn), total_epochs(trainer)]
    epochs = min(*until, stage_for(trainer).shared_epochs(trainer))
    if epochs < 1:
        return None
    plain = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(plain, dict)
    seed = "${seed}" if sampler.seed == cfg.seed else sampler.seed
    plain["sampler"] = {"_target_": "samplers.UniformSampler", "seed": seed}
    plain["loss"] = OmegaConf.to_container(OmegaConf.load(CONF / "loss" / "ce.yaml"))
    plain["trainer"].update(classifier_epochs=0, classifier_stage="retrain", classifier_lr=None)
    plain["seed"] = 0  # the family: every seed's runs of it want the same epochs
    return Prefix(config_key(OmegaConf.create(plain)), int(cfg.seed), epochs)


def _sampler_until(sampler: Sampler) -> int:
    """The epochs ``sampler`` draws exactly what the uniform sampler with its seed draws."""
    whole = sampler.num_samples == len(sampler.index)
    if type(sampler) is UniformSampler:
        return ALL if whole and not sampler.replacement else 0
    if type(sampler) is DeferredSampler and whole and sampler.shuffles_before:
        return sampler.switch_epoch
    return 0


def _loss_until(loss: ClassWeightedLoss) -> int:
    """The epochs ``loss`` is the plain cross-entropy."""
    if type(loss) is not ClassWeightedLoss or loss.gamma != 0:
        return 0
    return ALL if loss.class_weights is None else loss.weights_from_epoch


def cache_root(cfg: DictConfig) -> Path:
    """Where this run's sweep keeps its prefixes: ``prefixes.cache_dir``, or the user's
    cache folder (:mod:`runner.cache_dirs`)."""
    return Path(cfg.prefixes.cache_dir or cache_dirs.folder("prefixes")).expanduser()


def sweep_entry(cfg: DictConfig, parts: Parts, parent: str | None) -> Entry | None:
    """Where this run meets the jobs of its sweep (parent run ``parent``) that share its
    prefix; None outside a sweep, with ``prefixes.share=false``, or when it shares no epoch."""
    if parent is None or not cfg.prefixes.share:
        return None
    prefix = declared_prefix(cfg, parts)
    return Entry(cache_root(cfg), parent, prefix) if prefix is not None else None


@dataclass(frozen=True)
class Entry:
    """Where the jobs of sweep ``parent`` that share ``prefix`` meet."""

    root: Path
    parent: str
    prefix: Prefix

    @property
    def family(self) -> Path:
        return self.root / self.parent / self.prefix.family

    @property
    def folder(self) -> Path:
        return self.family / f"seed-{self.prefix.seed}"

    def snapshot(self, epoch: int) -> Path:
        return self.folder / f"epoch-{epoch:05d}.pt"

    def want(self) -> None:
        """Write down this job's epoch, for the jobs that train the prefix past it."""
        wants = self.family / "wants"
        wants.mkdir(parents=True, exist_ok=True)
        (wants / str(self.prefix.epochs)).touch()

    def wanted(self, epoch: int) -> bool:
        return (self.family / "wants" / str(epoch)).exists()

    def latest(self) -> Path | None:
        """The snapshot at the latest epoch up to this job's."""
        saved = (int(p.stem.split("-")[1]) for p in self.folder.glob("epoch-*.pt"))
        epochs = [e for e in saved if e <= self.prefix.epochs]
        return self.snapshot(max(epochs)) if epochs else None


class _Keeping:
    """The recorder while a job trains the prefix: passes every call on, keeps the epochs'
    metrics and tables for the snapshot, and after each epoch shows waiting jobs its progress
    and saves a snapshot where another job wants one."""

    def __init__(self, run: RunContext, entry: Entry):
        self.run, self.recorder, self.entry = run, run.recorder, entry
        self.rows: list[dict[str, Any]] = []

    def log_metrics(self, metrics: Any, step: int) -> None:
        self.recorder.log_metrics(metrics, step)
        self.rows.append({"step": step, "metrics": {k: float(v) for k, v in metrics.items()}})

    def log_table(self, name: str, table: dict[str, list[Any]]) -> None:
        self.recorder.log_table(name, table)
        self.rows.append({"table": name, "value": table})

    def epoch_done(self) -> None:
        epoch = self.run.parts.state.epoch
        if epoch < self.entry.prefix.epochs and self.entry.wanted(epoch):
            self.save()
        beat(self.entry.folder / "lock")

    def save(self) -> None:
        payload = self.run.checkpoint_payload()
        payload["rows"] = json.dumps(self.rows)
        save_checkpoint(self.entry.snapshot(self.run.parts.state.epoch), payload)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.recorder, name)


def fit_sharing(entry: Entry, run: RunContext) -> int:
    """:func:`runner.train.fit.fit` for ``run``, its prefix taken from or trained for the jobs
    of its sweep that share it (``entry``). Returns the epochs forked from a snapshot."""
    entry.want()
    wanted, lock = entry.snapshot(entry.prefix.epochs), entry.folder / "lock"
    what = f"the shared prefix to epoch {entry.prefix.epochs}"
    with turn(lock, WAIT_S, "prefixes.cache_dir", what, log.info, ready=wanted.exists):
        if wanted.exists():
            forked = _fork(wanted, run, [])
        else:  # this job's turn (or the holder stalled: then alone; snapshots are atomic)
            keeping = _Keeping(run, entry)
            latest = entry.latest()
            forked = _fork(latest, run, keeping.rows) if latest is not None else 0
            sharing = dataclasses.replace(
                run,
                recorder=cast(Recorder, keeping),
                logged_through=max(run.logged_through, forked),
            )
            fit(sharing, entry.prefix.epochs, keeping.epoch_done)
            keeping.save()
    run.logged_through = max(run.logged_through, entry.prefix.epochs)
    if forked:
        run.recorder.set_tags({FORKED_TAG: str(forked)})
        run.save_checkpoint()
    fit(run)
    return forked


def _fork(snapshot: Path, run: RunContext, rows: list[dict[str, Any]]) -> int:
    """Continue ``run`` from ``snapshot``: its training state and progress, its metrics and
    tables logged into this run (those after ``run.logged_through``) and kept in ``rows``; the
    epoch."""
    parts, progress, recorder, logged_through = (
        run.parts,
        run.progress,
        run.recorder,
        run.logged_through,
    )
    saved = load_checkpoint(snapshot)
    parts.state.load_state_dict(saved["train"])
    progress.load_state_dict(saved["progress"])
    progress.unlogged = []
    taken: list[dict[str, Any]] = json.loads(saved["rows"])
    now = int(time.time() * 1000)
    metrics = [
        (key, value, now, row["step"])
        for row in taken
        if "metrics" in row and row["step"] > logged_through
        for key, value in row["metrics"].items()
    ]
    recorder.log_rows(metrics)
    for row in taken:
        if "table" in row:
            recorder.log_table(row["table"], row["value"])
    rows.extend(taken)
    log.info("forked from %s at epoch %d", snapshot, parts.state.epoch)
    return parts.state.epoch


def remove_sweep_cache(root: Path, parent: str) -> None:
    """The finished sweep's snapshots go (a stopped sweep keeps them for its resumption)."""
    shutil.rmtree(root / parent, ignore_errors=True)
