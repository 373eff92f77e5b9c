"""One run: config -> dataset -> sampler -> batches -> model -> metrics -> tracking.

A run survives being stopped: it checkpoints every ``trainer.checkpoint_every`` epochs, on
SIGINT/SIGTERM it checkpoints at the next batch boundary and ends KILLED, and
``resume=<run id>`` continues the same MLflow run from its checkpoint. MLflow steps are the
epoch numbers the console prints (1 = after the first epoch; 0 holds the data's class counts).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from runner.config import (
    RUNTIME_KEYS,
    RunConfig,
    check_objective,
    check_targets,
    config_key,
    config_keys,
    resolved,
)
from runner.data import LongTailData
from runner.distributed import check_batch_size, command, data_parallel, from_main, is_main
from runner.errors import UserError
from runner.evaluation import Evaluation, evaluate
from runner.feeding import Feed, place
from runner.losses import ClassWeightedLoss, LDAMLoss
from runner.signals import Interrupted, raise_if_stopped, stop_on_signals
from runner.stores import bound_http_retries, prepare_store, resolve_uri
from runner.sweep import job_parent
from runner.tracking import (
    Bystander,
    PreviousRun,
    Row,
    StoreLost,
    Tracker,
    flatten,
    git_commit,
    previous_run,
)
from runner.train import (
    Diverged,
    TrainState,
    autocast,
    batches_per_epoch,
    build_state,
    load_checkpoint,
    save_checkpoint,
    start_classifier_stage,
    total_epochs,
    train_epoch,
)
from samplers import Sampler, sampling_stats

log = logging.getLogger("runner")


def active_sweeper() -> str | None:
    """The ``_target_`` of the sweeper that launched this job (None outside a multirun)."""
    if not HydraConfig.initialized():
        return None
    hydra = HydraConfig.get()
    return str(hydra.sweeper._target_) if hydra.mode == RunMode.MULTIRUN else None


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
) -> tuple[dict[str, float], np.ndarray, np.ndarray]:
    """What was drawn against what the sampler intended, per class and in summary."""
    target = sampler.target_class_shares()
    stats = sampling_stats(delivered, sampler.labels, target, sampler.num_classes)
    metrics = {
        f"sampling/share/{n}": float(s) for n, s in zip(class_names, stats.shares, strict=True)
    }
    metrics.update(
        {f"sampling/target/{n}": float(t) for n, t in zip(class_names, target, strict=True)}
    )
    metrics.update(
        {
            "sampling/unique_ratio": stats.unique_ratio,
            "sampling/max_repeats": stats.max_repeats,
            "sampling/never_drawn": stats.never_drawn,
            "sampling/kl_to_target": stats.kl_to_target,
            "sampling/imbalance_ratio": stats.imbalance_ratio,
        }
    )
    return metrics, stats.shares.numpy(), target.numpy()


def build(group: str, node: DictConfig, **supplied: Any) -> Any:
    """``instantiate`` one group's object; a bad value comes out as a :class:`UserError`
    naming the group."""
    try:
        return instantiate(node, **supplied, _convert_="all")
    except InstantiationException as wrapped:
        cause = wrapped.__cause__
        if isinstance(cause, UserError):
            raise cause from None
        if isinstance(cause, (ValueError, TypeError, FileNotFoundError)):
            raise UserError(f"{group} ({node._target_}): {cause}") from cause
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
class Progress:
    """What the epochs so far produced beyond the training state; checkpointed with it."""

    drawn: list[np.ndarray] = field(default_factory=list)  # class shares per epoch, as drawn
    target: list[np.ndarray] = field(default_factory=list)  # ... as intended
    latest: Evaluation | None = None
    latest_val: Evaluation | None = None  # the validation split's, at the same evaluation
    unlogged: list[Row] = field(default_factory=list)  # metrics a lost store did not take
    best: Evaluation | None = None  # on the test set, at the best epoch
    best_epoch: int = 0  # 1-based, as printed
    best_score: float = -1.0  # balanced accuracy the best epoch was chosen by

    def state_dict(self) -> dict[str, Any]:
        return {
            "drawn": [torch.from_numpy(a) for a in self.drawn],
            "target": [torch.from_numpy(a) for a in self.target],
            "latest": self.latest.state_dict() if self.latest else None,
            "latest_val": self.latest_val.state_dict() if self.latest_val else None,
            "best": self.best.state_dict() if self.best else None,
            "best_epoch": self.best_epoch,
            "best_score": self.best_score,
            "unlogged": list(self.unlogged),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Progress:
        def evaluation(s: dict[str, Any] | None) -> Evaluation | None:
            return Evaluation.from_state(s) if s else None

        return cls(
            drawn=[t.numpy() for t in state["drawn"]],
            target=[t.numpy() for t in state["target"]],
            latest=evaluation(state["latest"]),
            latest_val=evaluation(state.get("latest_val")),  # checkpoints before it have none
            best=evaluation(state["best"]),
            best_epoch=state["best_epoch"],
            best_score=state["best_score"],
            unlogged=[tuple(row) for row in state.get("unlogged", [])],
        )


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError(
            "config error at 'trainer.device': cuda requested but no CUDA device is available; use trainer.device=auto"
        )
    return torch.device(name)


def build_parts(cfg: DictConfig) -> Parts:
    """Validate the config and build every object, so that a bad value fails here."""
    check_targets(cfg)
    trainer = cfg.trainer
    check_batch_size(trainer.batch_size)
    device = _device(trainer.device)
    if trainer.threads:
        torch.set_num_threads(trainer.threads)
    torch.manual_seed(cfg.seed)
    data: LongTailData = place(build("data", cfg.data), device)  # in memory or a DataLoader
    sampler: Sampler = build("sampler", cfg.sampler, labels=data.train_y)
    model = build("model", cfg.model, in_shape=data.in_shape, num_classes=data.num_classes)
    loss_fn = build(
        "loss", cfg.loss, class_counts=data.train_counts, sampler=sampler, epochs=trainer.epochs
    )
    state = build_state(model.to(device), sampler, trainer, cfg.seed)
    state.parallel = data_parallel(state.model, device)  # under torchrun
    return Parts(data, sampler, loss_fn.to(device), state, device)


def start_tracking(
    cfg: DictConfig, data: LongTailData, choices: dict[str, str], overrides: list[str]
) -> Tracker:
    names = {group: choices[group] for group in ("sampler", "data", "model", "loss")}
    overridden = {o.split("=")[0].lstrip("+~") for o in overrides}
    # A published recipe (conf/method/: sampler, loss and settings); not when sampler= or loss=
    # on the command line replaced what the recipe chose.
    if choices.get("method") and not overridden & {"sampler", "loss"}:
        names["method"] = choices["method"]
    tags = dict(names)
    if cfg.tracking.reference:
        tags["reference"] = cfg.tracking.reference
    tags.update(
        imbalance_factor=str(data.imbalance_factor),
        git_commit=git_commit(),
        overrides=" ".join(overrides) or "(none)",
        config_key=config_key(cfg),
    )
    # Short parameters with the choice names, to group and filter by in the UI.
    params = {**flatten(resolved(cfg)), **names}
    tracker = Tracker.start(
        cfg.tracking.uri,
        cfg.tracking.experiment,
        run_name=f"{names.get('method', names['sampler'])}-{names['data']}-s{cfg.seed}",
        params=params,
        tags=tags,
        parent_run_id=job_parent(),
    )
    counts = {
        f"data/train_count/{n}": int(c)
        for n, c in zip(data.class_names, data.train_counts, strict=True)
    }
    test_counts = torch.bincount(data.test_y, minlength=data.num_classes)
    counts.update(
        {f"data/test_count/{n}": int(c) for n, c in zip(data.class_names, test_counts, strict=True)}
    )
    tracker.log_metrics(counts, step=0)
    tracker.log_artifacts({"config.yaml": OmegaConf.to_yaml(resolved(cfg))})
    return tracker


def _checkpoint_path(run_id: str, before: str | None = None) -> Path:
    """Where the run checkpoints: for a resumed run, the file it checkpointed to before (its
    ``checkpoint`` tag) while that folder is there, so that a run keeps one checkpoint; else
    beside the run's Hydra output (outputs/... or multirun/.../<job>); outside Hydra, in the
    temporary folder."""
    if before and Path(before).parent.is_dir():
        return Path(before)
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir) / "checkpoint.pt"
    return Path(tempfile.gettempdir()) / "samplerlab-checkpoints" / run_id / "checkpoint.pt"


def _resume_target(cfg: DictConfig, uri: str) -> tuple[DictConfig, PreviousRun | None]:
    """The config to run and the run to continue (None: start a new one, e.g. a sweep's job
    that did not run before)."""
    previous = previous_run(uri, cfg.resume, config_keys(cfg))
    if previous is None or previous.via_parent:
        return cfg, previous  # a sweep's job: its config is the sweep's
    _, overrides = _choices(cfg)
    extra = [o for o in overrides if o.split("=")[0].lstrip("+~") not in RUNTIME_KEYS]
    if extra:
        raise UserError(
            f"resume={cfg.resume!r} continues the run with its own config, but got {' '.join(extra)}\n"
            "drop those overrides, or start a new run without resume"
        )
    saved = OmegaConf.merge(OmegaConf.structured(RunConfig), OmegaConf.create(previous.config))
    for key in RUNTIME_KEYS:
        OmegaConf.update(saved, key, OmegaConf.select(cfg, key), merge=False)
    return saved, previous


RESULT_PREFIXES = ("final/", "val/", "test/")


def run(cfg: DictConfig) -> dict[str, float]:
    """Train and evaluate one configuration (or continue one with ``resume``); returns the
    results: the final test metrics (``final/``) and the last evaluation's headline metrics
    (``test/``, and ``val/`` with a validation split), from which :func:`objective` reads."""
    check_objective(cfg, active_sweeper())
    uri = resolve_uri(cfg.tracking.uri)
    bound_http_retries(cfg.tracking.retries, cfg.tracking.request_timeout)
    from_main(lambda: prepare_store(uri))  # under torchrun rank 0 decides, the others follow
    previous = None
    if cfg.resume:
        cfg, previous = from_main(lambda: _resume_target(cfg, uri), _without_client)
        if previous is not None and previous.status == "FINISHED":
            print(f"samplerlab: run {previous.run_id} already finished; nothing to resume")
            return {k: v for k, v in previous.metrics.items() if k.startswith(RESULT_PREFIXES)}
    parts = build_parts(cfg)
    progress = Progress()
    if previous is not None:  # before the run reopens: a checkpoint that fails leaves it as it was
        checkpoint = from_main(lambda: _saved_checkpoint(previous))
        if checkpoint is not None:
            parts.state.load_state_dict(checkpoint["train"])
            progress = Progress.from_state(checkpoint["progress"])
    with stop_on_signals():
        if previous is not None:
            tracker = from_main(lambda: Tracker.reopen(uri, previous.run_id), Bystander.of)
        else:
            choices, overrides = _choices(cfg)
            tracker = from_main(
                lambda: start_tracking(cfg, parts.data, choices, overrides), Bystander.of
            )
        before = previous.tags.get("checkpoint") if previous is not None else None
        return _train_tracked(cfg, parts, tracker, progress, previous is not None, before)


def _without_client(
    target: tuple[DictConfig, PreviousRun | None],
) -> tuple[DictConfig, PreviousRun | None]:
    """What ranks other than 0 receive of :func:`_resume_target`: they never read MLflow."""
    cfg, previous = target
    return cfg, dataclasses.replace(previous, client=None) if previous is not None else None


def _train_tracked(
    cfg: DictConfig,
    parts: Parts,
    tracker: Tracker,
    progress: Progress,
    resumed: bool,
    checkpointed_to: str | None,
) -> dict[str, float]:
    """Train with checkpoints, record the results, and end the run with the right status."""
    started = time.perf_counter()
    path = _checkpoint_path(tracker.run_id, checkpointed_to)
    logged_through = 0
    try:
        if resumed:
            tracker.log_rows(progress.unlogged)  # what a lost store did not take, at last
            progress.unlogged = []
            logged_through = tracker.last_step("train/loss") or 0
            log.info(
                "resuming run %s at epoch %d%s",
                tracker.run_id,
                parts.state.epoch + 1,
                f", batch {parts.state.batch + 1}" if parts.state.batch else "",
            )
        tracker.set_tags({"checkpoint": str(path)})
        train_and_track(cfg, parts, tracker, progress, path, logged_through)
        summary = record_results(cfg, parts, progress, tracker, path)
    except Interrupted as stop:
        if stop.safe:
            save_checkpoint(path, _checkpoint(parts, progress))
        tracker.finish("KILLED")
        if is_main():  # under torchrun, one line for the whole run
            print(
                f"samplerlab: stopped by {stop.signal_name} at epoch {parts.state.epoch + 1}; "
                f"run {tracker.run_id} is KILLED; continue it with: {_again(cfg, tracker)}",
                file=sys.stderr,
                flush=True,
            )
        raise
    except StoreLost as lost:  # the run cannot be ended there: it stays RUNNING until resumed
        progress.unlogged.extend(lost.unlogged)
        save_checkpoint(path, _checkpoint(parts, progress))
        then = (
            f"run {tracker.run_id} checkpointed to {path}; once the store answers again, "
            f"continue it with: {_again(cfg, tracker)}"
        )
        raise StoreLost(f"{lost}\n{then}", lost.unlogged) from None
    except BaseException:
        tracker.finish("FAILED")
        raise
    tracker.finish("FINISHED")
    final = progress.latest
    assert final is not None
    print(
        f"\nsamplerlab: {tracker.run_name}, {total_epochs(cfg.trainer)} epochs, "
        f"{time.perf_counter() - started:.1f} s on {parts.device.type}\n"
        f"  final            {_headline(final)}\n"
        f"  best (epoch {progress.best_epoch:>3})  {_headline(progress.best)}   "
        f"[{'selected on the validation split' if parts.data.val_x is not None else 'selected on the test set: optimistic'}]\n"
        f"  MLflow: {tracker.where()}",
        flush=True,
    )
    return summary


def _again(cfg: DictConfig, tracker: Tracker) -> str:
    """The command that continues this run."""
    again = f"{command()} resume={tracker.run_id}"
    return again + (f" tracking.uri={cfg.tracking.uri}" if cfg.tracking.uri else "")


def _saved_checkpoint(previous: PreviousRun) -> dict[str, Any] | None:
    with previous.checkpoint_file() as saved:
        return load_checkpoint(saved) if saved is not None else None


def _checkpoint(parts: Parts, progress: Progress) -> dict[str, Any]:
    return {"train": parts.state.state_dict(), "progress": progress.state_dict()}


def train_and_track(
    cfg: DictConfig,
    parts: Parts,
    tracker: Tracker,
    progress: Progress,
    checkpoint_path: Path,
    logged_through: int = 0,
) -> None:
    """Every epoch: train in the sampler's order, measure what was drawn, evaluate, log once
    (steps up to ``logged_through`` were logged before a resume and are not logged again),
    checkpoint. Signals are held until a batch ends, then stop the loop. With
    ``trainer.classifier_epochs`` (cRT) the classifier stage follows ``trainer.epochs``; the
    evaluation that ends stage one is also logged as ``stage1/*``."""
    trainer, data, state = cfg.trainer, parts.data, parts.state
    names = data.class_names
    feed = (parts.device, data.normalize, data.feeding.num_workers)
    train_x, train_y = Feed(data.train_x, *feed), data.train_y.to(parts.device)
    test_x, test_y = Feed(data.test_x, *feed), data.test_y.numpy()
    val_x = Feed(data.val_x, *feed) if data.val_x is not None else None
    augment = data.augment if trainer.augment else None
    show = trainer.progress and sys.stderr.isatty()
    steps = batches_per_epoch(parts.sampler, trainer.batch_size)
    last = total_epochs(trainer)
    with stop_on_signals(deferred=True):
        while state.epoch < last:
            if state.epoch >= trainer.epochs and not state.classifier_only:
                start_classifier_stage(state)
            epoch = state.epoch + 1  # as printed and logged
            latest = f"{progress.latest.balanced_accuracy:.3f}" if progress.latest else "-"
            bar = tqdm(
                total=steps,
                initial=state.batch,
                desc=f"epoch {epoch}/{last}",
                disable=not show,
                leave=False,
            )

            def on_batch(loss: torch.Tensor, bar: tqdm = bar, latest: str = latest) -> None:
                bar.update()
                if bar.n % 10 == 0:  # reading the loss synchronises the device: not every batch
                    bar.set_postfix(loss=f"{float(loss):.3f}", bal_acc=latest)
                raise_if_stopped()

            try:
                result = train_epoch(
                    state, train_x, train_y, parts.loss_fn, trainer.batch_size, augment, on_batch
                )
            except Diverged as diverged:
                if epoch > logged_through and not np.isnan(diverged.mean_loss_before):
                    tracker.log_metrics({"train/loss": diverged.mean_loss_before}, step=epoch)
                setting, fix = _divergence_cause(cfg, parts, state.classifier_only)
                raise UserError(
                    f"{setting}: the training loss became non-finite at epoch {epoch}, batch "
                    f"{diverged.batch + 1}\n{fix}"
                ) from diverged
            finally:
                bar.close()
            metrics, drawn, target = sampling_metrics(parts.sampler, result.delivered, names)
            progress.drawn.append(drawn)
            progress.target.append(target)
            metrics["train/loss"] = result.mean_loss
            metrics["train/lr"] = state.optimizer.param_groups[0]["lr"]
            stage_one_ends = state.epoch == trainer.epochs < last
            if state.epoch % trainer.eval_every == 0 or state.epoch == last or stage_one_ends:
                evaluation = _evaluate(cfg, parts, test_x, test_y)
                metrics.update(evaluation.metrics(names))
                if stage_one_ends:
                    metrics.update(evaluation.metrics(names, "stage1"))
                progress.latest = evaluation
                score = evaluation.balanced_accuracy
                if val_x is not None:  # the honest choice of the best epoch
                    validation = _evaluate(cfg, parts, val_x, data.val_y.numpy())
                    metrics.update(validation.metrics(names, "val"))
                    progress.latest_val = validation
                    score = validation.balanced_accuracy
                if score > progress.best_score:
                    progress.best, progress.best_epoch, progress.best_score = (
                        evaluation,
                        epoch,
                        score,
                    )
                log.info(
                    "epoch %d/%d  loss %.4f  %s",
                    epoch,
                    last,
                    result.mean_loss,
                    _headline(evaluation),
                )
            if epoch > logged_through:
                tracker.log_metrics(metrics, step=epoch)
            every = trainer.checkpoint_every
            if every and (state.epoch % every == 0 or state.epoch == last):
                save_checkpoint(checkpoint_path, _checkpoint(parts, progress))
            raise_if_stopped()


def _divergence_cause(cfg: DictConfig, parts: Parts, classifier_only: bool) -> tuple[str, str]:
    """The setting to blame for a non-finite loss and its fix. Every data source checks that its
    samples are finite, so the inputs are not the cause; LDAM's scale on an unbounded linear
    head is a known one, else the learning rate."""
    trainer = cfg.trainer
    if classifier_only:  # cRT's stage two: its own lr, by default trainer.lr
        setting = f"trainer.classifier_lr={trainer.classifier_lr or trainer.lr}"
        return setting, "set a lower trainer.classifier_lr"
    if isinstance(parts.loss_fn, LDAMLoss) and cfg.model.get("head", "linear") != "cosine":
        return (
            f"loss=ldam (loss.scale={parts.loss_fn.scale}) on model.head={cfg.model.get('head')}",
            "use model.head=cosine, the head LDAM's scale is meant for (+method=ldam_drw sets "
            "both), or trainer.lr=0.01, or loss.scale=1",
        )
    return f"trainer.lr={trainer.lr}", "lower trainer.lr (or raise trainer.warmup_epochs)"


def _evaluate(cfg: DictConfig, parts: Parts, x: Feed, y: np.ndarray) -> Evaluation:
    with autocast(parts.device):
        predictions = x.predict(parts.state.model, cfg.trainer.eval_batch_size)
    counts = parts.data.train_counts.numpy()
    return evaluate(
        y, predictions, counts, parts.data.class_names, cfg.eval.many_shot, cfg.eval.few_shot
    )


def _figures(parts: Parts, progress: Progress, title: str) -> dict[str, Any]:
    """The run's figures; one that cannot be drawn is skipped with a warning, never failing
    the run (its metrics are recorded by then)."""
    from runner import plots  # here: matplotlib takes half a second to import

    names, counts = parts.data.class_names, parts.data.train_counts.numpy()
    final = progress.latest
    makers = {
        "confusion_matrix.png": lambda: plots.confusion_matrix_figure(
            final.confusion, names, title
        ),
        "per_class_accuracy.png": lambda: plots.per_class_accuracy_figure(
            final.recall, counts, names, title
        ),
        "sampled_class_shares.png": lambda: plots.sampled_shares_figure(
            np.stack(progress.drawn), np.stack(progress.target), names, title
        ),
    }
    figures = {}
    for name, make in makers.items():
        try:
            figures[name] = make()
        except Exception as error:  # a figure is never a reason to lose a run
            warnings.warn(f"figure {name} skipped: {type(error).__name__}: {error}", stacklevel=1)
    return figures


def record_results(
    cfg: DictConfig, parts: Parts, progress: Progress, tracker: Tracker, checkpoint_path: Path
) -> dict[str, float]:
    """Final metrics, reports, figures and the last checkpoint. Best-epoch numbers are chosen
    on the test set, so they are optimistic: reported in a labelled text file, not as metrics."""
    names = parts.data.class_names
    final, best = progress.latest, progress.best
    assert final is not None and best is not None  # the last epoch always evaluates
    summary = final.metrics(names, "final")
    chosen_on = "the test set (optimistic: compare final values)"
    if parts.data.val_x is not None:
        chosen_on = "the validation split"
        summary.update({**best.metrics(names, "best"), "best/epoch": progress.best_epoch})
    if tracker.last_step("final/balanced_accuracy") != total_epochs(cfg.trainer):
        tracker.log_metrics(summary, step=total_epochs(cfg.trainer))  # once, also when resumed
    results = {**summary, **final.headline("test")}
    if progress.latest_val is not None:
        results.update(progress.latest_val.headline("val"))
    files: dict[str, Any] = {
        "classification_report.txt": final.report,
        "best_classification_report.txt": f"best epoch {progress.best_epoch} of "
        f"{total_epochs(cfg.trainer)}, selected on {chosen_on}\n\n{best.report}",
    }
    if checkpoint_path.is_file():
        files["checkpoint/checkpoint.pt"] = checkpoint_path
    if cfg.tracking.plots and is_main():  # other ranks log nothing
        files.update(_figures(parts, progress, tracker.run_name))
    tracker.log_artifacts(files)
    for figure in files.values():
        if hasattr(figure, "savefig"):
            figure.clear()  # matplotlib keeps figures alive until closed
            import matplotlib.pyplot as plt

            plt.close(figure)
    return results


def objective(cfg: DictConfig, results: dict[str, float]) -> float:
    """The value of ``cfg.objective`` in a run's results (NaN when the run has no such split:
    a validation objective without a validation split, outside an optimising sweeper)."""
    return float(results.get(cfg.objective, float("nan")))
