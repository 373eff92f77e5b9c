"""One run: config -> dataset -> sampler -> batches -> model -> metrics -> tracking."""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from runner import plots
from runner.config import check_targets
from runner.data import LongTailData
from runner.evaluation import Evaluation, evaluate, predict
from runner.losses import ClassWeightedLoss
from runner.tracking import Tracker, flatten, git_commit
from runner.train import TrainState, autocast, batches_per_epoch, build_state, train_epoch
from samplers import Sampler, sampling_stats

log = logging.getLogger("runner")


def _choices(cfg: DictConfig) -> tuple[dict[str, str], list[str]]:
    """Hydra's chosen config names and overrides; outside a Hydra app, the targets' names."""
    if HydraConfig.initialized():
        hydra = HydraConfig.get()
        return {k: str(v) for k, v in hydra.runtime.choices.items()}, list(hydra.overrides.task)
    return {
        g: str(cfg[g]._target_).rsplit(".", 1)[-1] for g in ("data", "model", "sampler", "loss")
    }, []


def sampling_metrics(
    sampler: Sampler, delivered: torch.Tensor, class_names: list[str]
) -> tuple[dict[str, float], np.ndarray]:
    stats = sampling_stats(
        delivered, sampler.labels, sampler.target_class_shares(), sampler.num_classes
    )
    metrics = {
        f"sampling/share/{n}": float(s) for n, s in zip(class_names, stats.shares, strict=True)
    }
    metrics.update(
        {
            "sampling/unique_ratio": stats.unique_ratio,
            "sampling/max_repeats": stats.max_repeats,
            "sampling/never_drawn": stats.never_drawn,
            "sampling/kl_to_target": stats.kl_to_target,
            "sampling/imbalance_ratio": stats.imbalance_ratio,
        }
    )
    return metrics, stats.shares.numpy()


def build(group: str, node: DictConfig, **supplied: Any) -> Any:
    """``instantiate`` one group's object; its own error comes out unwrapped, naming the group."""
    try:
        return instantiate(node, **supplied, _convert_="all")
    except InstantiationException as wrapped:
        cause = wrapped.__cause__
        if isinstance(cause, (ValueError, TypeError, FileNotFoundError)):
            raise type(cause)(f"{group} ({node._target_}): {cause}") from cause
        raise


def _headline(evaluation: Evaluation) -> str:
    parts = [
        f"acc {evaluation.accuracy:.4f}",
        f"bal-acc {evaluation.balanced_accuracy:.4f}",
        f"macro-F1 {evaluation.macro_f1:.4f}",
    ]
    parts += [
        f"{g} {getattr(evaluation, g + '_accuracy'):.4f}"
        for g in ("many", "medium", "few")
        if not np.isnan(getattr(evaluation, g + "_accuracy"))
    ]
    return "  ".join(parts)


@dataclass
class Parts:
    """Everything one run is built from, constructed before any training or tracking."""

    data: LongTailData
    sampler: Sampler
    loss_fn: ClassWeightedLoss
    state: TrainState
    device: torch.device


@dataclass
class Outcome:
    final: Evaluation
    best: Evaluation
    best_epoch: int
    shares_per_epoch: np.ndarray  # epochs x classes, as drawn


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "config error at 'trainer.device': cuda requested but no CUDA device is available; use trainer.device=auto"
        )
    return torch.device(name)


def build_parts(cfg: DictConfig) -> Parts:
    """Validate the config and build every object, so that a bad value fails here."""
    check_targets(cfg)
    trainer = cfg.trainer
    device = _device(trainer.device)
    if trainer.threads:
        torch.set_num_threads(trainer.threads)
    torch.manual_seed(cfg.seed)
    data: LongTailData = build("data", cfg.data)
    sampler: Sampler = build("sampler", cfg.sampler, labels=data.train_y)
    model = build("model", cfg.model, in_shape=data.in_shape, num_classes=data.num_classes)
    loss_fn = build(
        "loss", cfg.loss, class_counts=data.train_counts, sampler=sampler, epochs=trainer.epochs
    )
    state = build_state(model.to(device), sampler, trainer, cfg.seed)
    return Parts(data, sampler, loss_fn.to(device), state, device)


def resolved(cfg: DictConfig) -> dict[str, Any]:
    """The config with every interpolation resolved, as plain containers."""
    return OmegaConf.to_container(cfg, resolve=True)


def start_tracking(
    cfg: DictConfig, data: LongTailData, choices: dict[str, str], overrides: list[str]
) -> Tracker:
    tags = {group: choices[group] for group in ("sampler", "data", "model", "loss")}
    tags.update(
        imbalance_factor=str(data.imbalance_factor),
        git_commit=git_commit(),
        overrides=" ".join(overrides) or "(none)",
    )
    return Tracker(
        cfg.tracking.uri,
        cfg.tracking.experiment,
        run_name=f"{choices['sampler']}-{choices['data']}-s{cfg.seed}",
        params=flatten(resolved(cfg)),
        tags=tags,
    )


def train(cfg: DictConfig, parts: Parts, tracker: Tracker) -> Outcome:
    """Every epoch: train in the sampler's order, measure what was drawn, evaluate, log once."""
    trainer, data, state = cfg.trainer, parts.data, parts.state
    names, counts = data.class_names, data.train_counts.numpy()
    train_x, train_y = data.train_x.to(parts.device), data.train_y.to(parts.device)
    test_x, test_y = data.test_x.to(parts.device), data.test_y.numpy()
    augment = data.augment if trainer.augment else None
    show = trainer.progress and sys.stderr.isatty()
    steps = batches_per_epoch(parts.sampler, trainer.batch_size)
    shares_per_epoch: list[np.ndarray] = []
    evaluation: Evaluation | None = None
    best: tuple[Evaluation, int] | None = None
    while state.epoch < trainer.epochs:
        epoch = state.epoch
        latest = f"{evaluation.balanced_accuracy:.3f}" if evaluation else "-"
        bar = tqdm(
            total=steps, desc=f"epoch {epoch + 1}/{trainer.epochs}", disable=not show, leave=False
        )

        def on_batch(loss: torch.Tensor, bar: tqdm = bar, latest: str = latest) -> None:
            bar.update()
            if bar.n % 10 == 0:  # reading the loss synchronises the device: not every batch
                bar.set_postfix(loss=f"{float(loss):.3f}", bal_acc=latest)

        result = train_epoch(
            state, train_x, train_y, parts.loss_fn, trainer.batch_size, augment, on_batch
        )
        bar.close()
        metrics, shares = sampling_metrics(parts.sampler, result.delivered, names)
        shares_per_epoch.append(shares)
        metrics["train/loss"] = result.mean_loss
        metrics["train/lr"] = state.optimizer.param_groups[0]["lr"]
        if state.epoch % trainer.eval_every == 0 or state.epoch == trainer.epochs:
            with autocast(parts.device):
                predictions = predict(state.model, test_x, trainer.eval_batch_size)
            evaluation = evaluate(
                test_y, predictions, counts, names, cfg.eval.many_shot, cfg.eval.few_shot
            )
            metrics.update(evaluation.metrics(names))
            if best is None or evaluation.balanced_accuracy > best[0].balanced_accuracy:
                best = (evaluation, epoch)
            log.info(
                "epoch %d/%d  loss %.4f  %s",
                epoch + 1,
                trainer.epochs,
                result.mean_loss,
                _headline(evaluation),
            )
        tracker.log_metrics(metrics, step=epoch)
    assert evaluation is not None and best is not None  # the last epoch always evaluates
    return Outcome(evaluation, best[0], best[1], np.stack(shares_per_epoch))


def record_results(
    cfg: DictConfig, parts: Parts, outcome: Outcome, tracker: Tracker
) -> dict[str, float]:
    """Final and best-epoch metrics, reports and figures."""
    names = parts.data.class_names
    summary = {
        **outcome.final.metrics(names, "final"),
        **outcome.best.metrics(names, "best"),
        "best/epoch": outcome.best_epoch,
    }
    tracker.log_metrics(summary, step=cfg.trainer.epochs - 1)
    files: dict[str, Any] = {
        "config.yaml": OmegaConf.to_yaml(resolved(cfg)),
        "classification_report.txt": outcome.final.report,
        "best_classification_report.txt": f"best epoch {outcome.best_epoch + 1} (MLflow step "
        f"{outcome.best_epoch}), selected on the test set\n\n{outcome.best.report}",
    }
    if cfg.tracking.plots:
        counts = parts.data.train_counts.numpy()
        files["confusion_matrix.png"] = plots.confusion_matrix_figure(
            outcome.final.confusion, names
        )
        files["per_class_accuracy.png"] = plots.per_class_accuracy_figure(
            outcome.final.recall, counts, names
        )
        files["sampled_class_shares.png"] = plots.sampled_shares_figure(
            outcome.shares_per_epoch, parts.sampler.target_class_shares().numpy(), names
        )
    tracker.log_artifacts(files)
    for figure in files.values():
        if hasattr(figure, "savefig"):
            plots.plt.close(figure)
    return summary


def run(cfg: DictConfig) -> dict[str, float]:
    """Train and evaluate one configuration; returns the final and best-epoch test metrics."""
    parts = build_parts(cfg)
    choices, overrides = _choices(cfg)
    tracker = start_tracking(cfg, parts.data, choices, overrides)
    started = time.perf_counter()
    try:
        outcome = train(cfg, parts, tracker)
        summary = record_results(cfg, parts, outcome, tracker)
    except KeyboardInterrupt:
        tracker.finish("KILLED")
        raise
    except BaseException:
        tracker.finish("FAILED")
        raise
    tracker.finish("FINISHED")
    print(
        f"\nsamplerlab: {choices['sampler']} on {choices['data']} ({choices['model']}, seed {cfg.seed}), "
        f"{cfg.trainer.epochs} epochs in {time.perf_counter() - started:.1f} s on {parts.device.type}\n"
        f"  final            {_headline(outcome.final)}\n"
        f"  best (epoch {outcome.best_epoch + 1:>3})  {_headline(outcome.best)}   [selected on the test set: optimistic]\n"
        f"  MLflow: {tracker.where()}",
        flush=True,
    )
    return summary
