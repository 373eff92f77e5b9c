"""A run's results: final metrics, reports, figures and the last checkpoint recorded at its end,
the console summary, and the value a sweeper optimises (:func:`objective`)."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from runner.distributed import is_main
from runner.models import FeatureClassifier, Predictor
from runner.train.evaluation import Evaluation
from runner.train.feed import Feed
from runner.train.multilabel_run import positive_class, probabilities
from runner.train.ranking import curve
from runner.train.recorder import class_table, per_class_as_table
from runner.train.run import Parts, Progress, RunContext
from runner.train.state import autocast, total_epochs

RESULT_PREFIXES = ("final/", "val/", "test/", "cost/")


def _figures(parts: Parts, progress: Progress, title: str) -> dict[str, Any]:
    """The run's figures; one that cannot be drawn is skipped with a warning, never failing
    the run (its metrics are recorded by then)."""
    from runner import plots  # here: matplotlib takes half a second to import

    names, counts = parts.data.class_names, parts.data.train_counts.numpy()
    final = progress.latest
    assert final is not None  # the last epoch always evaluates
    makers = {
        "sampled_class_shares.png": lambda: plots.sampled_shares_figure(
            np.stack(progress.drawn), np.stack(progress.target), names, title
        ),
    }
    if isinstance(final, Evaluation):  # one predicted class per sample
        makers["confusion_matrix.png"] = lambda: plots.confusion_matrix_figure(
            final.confusion, names, title
        )
        makers["per_class_accuracy.png"] = lambda: plots.per_class_accuracy_figure(
            final.recall, counts, names, title
        )
    if progress.latest_rare:  # binary data: the rare class's precision-recall curve
        makers["precision_recall.png"] = lambda: _precision_recall(parts, progress, title)
    figures = {}
    for name, make in makers.items():
        try:
            figures[name] = make()
        except Exception as error:  # a figure is never a reason to lose a run
            warnings.warn(f"figure {name} skipped: {type(error).__name__}: {error}", stacklevel=1)
    return figures


def _precision_recall(parts: Parts, progress: Progress, title: str) -> Any:
    """The test split's precision-recall curve of the rare class, from the model as it ends, with
    the threshold chosen on the validation split where there is one."""
    from runner import plots

    data = parts.data
    positive = positive_class(data.train_counts)
    test_x = Feed(data.test_x, parts.device, data.normalize, data.feeding.num_workers)
    with autocast(parts.device):
        scores = probabilities(
            parts.state.model, test_x, parts.trainer.eval_batch_size, multi_label=False
        )[:, positive : positive + 1]
    targets = (data.test_y == positive).reshape(-1, 1).to(scores.device)
    counted = curve(scores, targets)
    kept = counted.kept[:, 0]
    tp, fp = counted.tp[kept, 0], counted.fp[kept, 0]
    precision = torch.cat([tp.new_ones(1), tp / (tp + fp)]).cpu().numpy()
    recall = torch.cat([tp.new_zeros(1), tp / counted.positives[0]]).cpu().numpy()
    rare = progress.latest_rare
    chosen = None
    if "test/threshold" in rare and np.isfinite(rare["test/threshold"]):
        chosen = (rare["test/threshold"], rare["test/precision"], rare["test/recall"])
    return plots.precision_recall_figure(
        precision, recall, rare["test/average_precision"], chosen, title
    )


def record_results(run: RunContext, forked: int = 0) -> dict[str, float]:
    """``run``'s final metrics, reports, figures and last checkpoint. Best-epoch numbers are
    chosen on the test set, so they are optimistic: reported in a labelled text file, not as
    metrics. ``cost/epochs_trained``: the run's epochs less the ``forked`` ones another job
    trained."""
    parts, progress, recorder = run.parts, run.progress, run.recorder
    names = parts.data.class_names
    final, best = progress.latest, progress.best
    assert final is not None and best is not None  # the last epoch always evaluates
    tabled = per_class_as_table(parts.tracking, len(names))
    summary = final.metrics(names, "final", per_class=not tabled)
    rare = progress.latest_rare  # binary data: the last evaluation's rare-positive metrics
    summary.update(
        {f"final/{k.removeprefix('test/')}": v for k, v in rare.items() if k[:5] == "test/"}
    )
    columns = {
        "data/train_count": parts.data.train_counts.numpy(),
        "data/test_count": final.support,
        **final.class_columns("final"),
        "sampling/share": progress.drawn[-1],
        "sampling/target": progress.target[-1],
    }
    chosen_on = "the test set (optimistic: compare final values)"
    if parts.data.val_x is not None:
        chosen_on = "the validation split"
        summary.update(best.metrics(names, "best", per_class=not tabled))
        summary["best/epoch"] = progress.best_epoch
        columns.update(best.class_columns("best"))
    last, tracking = total_epochs(parts.trainer), parts.tracking
    summary["cost/epochs_trained"] = last - forked
    if recorder.last_step(f"final/{final.score_name}") != last:
        # Once, also when the run is resumed after its end was cut short.
        if tabled:
            recorder.log_table("per_class/final.json", class_table(names, columns))
        recorder.log_metrics(summary, step=last)
        if tracking.log_model and is_main():  # its metrics: the final step's, just logged
            recorder.log_model(*predictor(parts), names, tracking.register, last)
    results = {**summary, **final.headline("test")}
    if progress.latest_val is not None:
        results.update(progress.latest_val.headline("val"))
    results.update(rare)  # what a race on val/average_precision reads
    files: dict[str, Any] = {
        "classification_report.txt": final.report,
        "best_classification_report.txt": f"best epoch {progress.best_epoch} of "
        f"{last}, selected on {chosen_on}\n\n{best.report}",
    }
    if run.path.is_file():
        files["checkpoint/checkpoint.pt"] = run.path
    if tracking.plots and is_main():  # other ranks log nothing
        files.update(_figures(parts, progress, recorder.run_name))
    recorder.log_artifacts(files)
    for figure in files.values():
        if hasattr(figure, "savefig"):
            figure.clear()  # matplotlib keeps figures alive until closed
            import matplotlib.pyplot as plt

            plt.close(figure)
    return results


def predictor(parts: Parts) -> tuple[torch.nn.Module, np.ndarray]:
    """The model to log (on the CPU, in eval mode, taking samples as they are stored) and an
    input example: the first two test samples. A head trained on cached features is logged
    with its frozen backbone in front, taking the stored samples too."""
    frozen, data = parts.frozen, parts.stored_data
    test_x = data.test_x
    rows = test_x[:2] if torch.is_tensor(test_x) else test_x.__getitems__([0, 1])
    model = parts.state.model
    if frozen is not None:
        assert isinstance(model, FeatureClassifier)  # freeze built it
        model = frozen.model_for(model)
    return Predictor(copy.deepcopy(model).cpu(), data.normalize).eval(), rows.cpu().numpy()


def objective(cfg: DictConfig, results: dict[str, float]) -> float:
    """The value of ``cfg.objective`` in a run's results (NaN when the run has no such split:
    a validation objective without a validation split, outside an optimising sweeper)."""
    return float(results.get(cfg.objective, float("nan")))


def summary_text(run: RunContext, seconds: float) -> str:
    """What the console says when ``run`` ends: its final and best-epoch metrics, and where."""
    parts, progress, recorder = run.parts, run.progress, run.recorder
    final, best = progress.latest, progress.best
    assert final is not None and best is not None
    chosen = (
        "selected on the validation split"
        if parts.data.val_x is not None
        else "selected on the test set: optimistic"
    )
    return (
        f"\nsamplerlab: {recorder.run_name}, {total_epochs(parts.trainer)} epochs, "
        f"{seconds:.1f} s on {parts.device.type}\n"
        f"  final            {final.one_line()}\n"
        f"  best (epoch {progress.best_epoch:>3})  {best.one_line()}   [{chosen}]\n"
        f"  MLflow: {recorder.where()}"
    )
