"""One run: config -> dataset -> sampler -> batches -> model -> metrics -> tracking."""

from __future__ import annotations

import logging
import sys
import time
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
from runner.tracking import Tracker, flatten, git_commit
from runner.train import autocast, batches_per_epoch, build_state, train_epoch
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


def run(cfg: DictConfig) -> dict[str, float]:
    """Train and evaluate one configuration; returns the final test metrics."""
    check_targets(cfg)
    trainer = cfg.trainer
    if trainer.threads:
        torch.set_num_threads(trainer.threads)
    device = torch.device(
        "cuda"
        if trainer.device == "auto" and torch.cuda.is_available()
        else "cpu"
        if trainer.device == "auto"
        else trainer.device
    )
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "config error at 'trainer.device': cuda requested but no CUDA device is available; use trainer.device=auto"
        )
    torch.manual_seed(cfg.seed)

    # Build everything first, so that any bad value fails before training or tracking starts.
    data: LongTailData = build("data", cfg.data)
    sampler: Sampler = build("sampler", cfg.sampler, labels=data.train_y)
    model = build("model", cfg.model, in_shape=data.in_shape, num_classes=data.num_classes)
    loss_fn = build(
        "loss", cfg.loss, class_counts=data.train_counts, sampler=sampler, epochs=trainer.epochs
    )
    model, loss_fn = model.to(device), loss_fn.to(device)
    state = build_state(model, sampler, trainer, cfg.seed)
    choices, overrides = _choices(cfg)
    names = data.class_names
    counts = data.train_counts.numpy()
    train_x, train_y = data.train_x.to(device), data.train_y.to(device)
    test_x = data.test_x.to(device)
    augment = data.augment if trainer.augment else None

    resolved = OmegaConf.to_container(cfg, resolve=True)
    tracker = Tracker(
        cfg.tracking.uri,
        cfg.tracking.experiment,
        run_name=f"{choices['sampler']}-{choices['data']}-s{cfg.seed}",
        params=flatten(resolved),
        tags={
            "sampler": choices["sampler"],
            "data": choices["data"],
            "model": choices["model"],
            "loss": choices["loss"],
            "imbalance_factor": str(data.imbalance_factor),
            "git_commit": git_commit(),
            "overrides": " ".join(overrides) or "(none)",
        },
    )
    started = time.perf_counter()
    try:
        shares_per_epoch, history = [], []
        best: tuple[float, int, Evaluation] | None = None
        evaluation: Evaluation | None = None
        show = trainer.progress and sys.stderr.isatty()
        steps = batches_per_epoch(sampler, trainer.batch_size)
        while state.epoch < trainer.epochs:
            epoch = state.epoch
            bar = tqdm(
                total=steps,
                desc=f"epoch {epoch + 1}/{trainer.epochs}",
                disable=not show,
                leave=False,
            )
            latest = f"{evaluation.balanced_accuracy:.3f}" if evaluation else "-"

            def on_batch(loss: torch.Tensor, bar: tqdm = bar, latest: str = latest) -> None:
                bar.update()
                if bar.n % 10 == 0:
                    bar.set_postfix(loss=f"{float(loss):.3f}", bal_acc=latest)

            result = train_epoch(
                state, train_x, train_y, loss_fn, trainer.batch_size, augment, on_batch
            )
            bar.close()
            metrics, shares = sampling_metrics(sampler, result.delivered, names)
            shares_per_epoch.append(shares)
            metrics["train/loss"] = result.mean_loss
            metrics["train/lr"] = state.optimizer.param_groups[0]["lr"]
            if state.epoch % trainer.eval_every == 0 or state.epoch == trainer.epochs:
                with autocast(device):
                    predictions = predict(model, test_x, trainer.eval_batch_size)
                evaluation = evaluate(
                    data.test_y.numpy(),
                    predictions,
                    counts,
                    names,
                    cfg.eval.many_shot,
                    cfg.eval.few_shot,
                )
                metrics.update(evaluation.metrics(names))
                if best is None or evaluation.balanced_accuracy > best[0]:
                    best = (evaluation.balanced_accuracy, epoch, evaluation)
                log.info(
                    "epoch %d/%d  loss %.4f  %s",
                    epoch + 1,
                    trainer.epochs,
                    result.mean_loss,
                    _headline(evaluation),
                )
            tracker.log_metrics(metrics, step=epoch)
            history.append(metrics)

        assert evaluation is not None and best is not None
        summary = {
            **evaluation.metrics(names, "final"),
            **best[2].metrics(names, "best"),
            "best/epoch": best[1],
        }
        tracker.log_metrics(summary, step=trainer.epochs - 1)
        files: dict[str, Any] = {
            "config.yaml": OmegaConf.to_yaml(resolved),
            "classification_report.txt": evaluation.report,
            "best_classification_report.txt": f"best epoch {best[1]} (selected on the test set)\n\n{best[2].report}",
        }
        if cfg.tracking.plots:
            files["confusion_matrix.png"] = plots.confusion_matrix_figure(
                evaluation.confusion, names
            )
            files["per_class_accuracy.png"] = plots.per_class_accuracy_figure(
                evaluation.recall, counts, names
            )
            files["sampled_class_shares.png"] = plots.sampled_shares_figure(
                np.stack(shares_per_epoch), sampler.target_class_shares().numpy(), names
            )
        tracker.log_artifacts(files)
        for figure in files.values():
            if hasattr(figure, "savefig"):
                plots.plt.close(figure)
    except BaseException:
        tracker.finish(failed=True)
        raise
    tracker.finish()
    seconds = time.perf_counter() - started
    print(
        f"\nsamplerlab: {choices['sampler']} on {choices['data']} ({choices['model']}, seed {cfg.seed}), "
        f"{trainer.epochs} epochs in {seconds:.1f} s on {device.type}\n"
        f"  final            {_headline(evaluation)}\n"
        f"  best (epoch {best[1] + 1:>3})  {_headline(best[2])}   [selected on the test set: optimistic]\n"
        f"  MLflow: {tracker.where()}",
        flush=True,
    )
    return summary
