"""The report's figures (matplotlib, Agg backend), rendered to PNG bytes."""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from experiments.stats import Interval, clipped  # noqa: E402


def bar_ends(interval: Interval) -> tuple[float, float]:
    """An error bar's ends: the interval clipped to [0, 1] (the mean alone from one seed)."""
    if math.isnan(interval.half_width):
        return interval.mean, interval.mean
    return clipped(interval.low, interval.high)


def axis_range(limits: tuple[float, float]) -> tuple[float, float]:
    """An axis of values in [0, 1] (accuracies) kept inside [0, 1]: matplotlib's margins would
    otherwise run past 1 and suggest values there."""
    return clipped(*limits)


def png(figure: Figure) -> bytes:
    """The figure as PNG bytes; closes it."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(figure)
    return buffer.getvalue()


def _class_ticks(ax: Axes, classes: Sequence[str]) -> None:
    x = np.arange(len(classes))
    show = len(classes) <= 30
    ax.set_xticks(x if show else [], list(classes) if show else [], rotation=90 if show else 0)


def _group_edges(ax: Axes, groups: Sequence[str] | None) -> None:
    """Dashed lines between the many / medium / few classes, labelled at the top."""
    if not groups:
        return
    start = 0
    for i in range(1, len(groups) + 1):
        if i == len(groups) or groups[i] != groups[start]:
            if i < len(groups):
                ax.axvline(i - 0.5, color="grey", linestyle="--", linewidth=0.8)
            ax.text((start + i - 1) / 2, 1.01, groups[start], ha="center", va="bottom", fontsize=8)
            start = i


def recall_by_strategy(
    recall: Mapping[str, Sequence[float]], classes: Sequence[str], groups: Sequence[str] | None
) -> Figure:
    """Mean final per-class recall of each strategy, classes in training-count order."""
    fig, ax = plt.subplots(figsize=(max(7, 0.35 * len(classes) + 3), 4.2))
    x = np.arange(len(classes))
    for label, values in recall.items():
        ax.plot(x, values, marker="o", markersize=3, linewidth=1.2, label=label, clip_on=False)
    # A recall of 1 is drawn on the edge (clip_on=False), not below an axis that runs past 1.
    ax.set_ylim(0, 1)
    ax.set_xlim(-0.5, len(classes) - 0.5)
    _class_ticks(ax, classes)
    _group_edges(ax, groups)
    ax.set_xlabel("class (most training images on the left)")
    ax.set_ylabel("test recall (mean over seeds)")
    ax.set_title("Per-class recall by strategy (final epoch)", pad=16)
    ax.legend(loc="center left", bbox_to_anchor=(1, 0.5), fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return fig


def shares_by_strategy(
    drawn: Mapping[str, Sequence[float]],
    intended: Mapping[str, Sequence[float] | None],
    classes: Sequence[str],
) -> Figure:
    """Per strategy: class shares drawn in the last epoch (bars) against the sampler's intended
    shares (black steps), classes in training-count order."""
    labels = list(drawn)
    cols = min(3, len(labels))
    rows = math.ceil(len(labels) / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(4.2 * cols, 2.9 * rows), squeeze=False, sharey=True
    )
    x = np.arange(len(classes))
    for ax, label in zip(axes.flat, labels, strict=False):
        ax.bar(x, drawn[label], color="tab:blue", alpha=0.75, label="drawn")
        target = intended.get(label)
        if target is not None:
            ax.step(x, target, where="mid", color="black", linewidth=1.4, label="intended")
        ax.set_title(label, fontsize=10)
        _class_ticks(ax, classes)
        ax.tick_params(axis="x", labelsize=7)
    for ax in axes.flat[len(labels) :]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("share of the epoch")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle("Drawn vs intended class shares (last epoch, mean over seeds)")
    fig.tight_layout()
    return fig


def metrics_with_intervals(
    intervals: Mapping[str, Mapping[str, Interval | None]], titles: Mapping[str, str]
) -> Figure:
    """One panel per metric: each strategy's mean with its 95% interval over seeds, clipped to
    [0, 1], on an axis inside [0, 1]."""
    metrics = list(titles)
    labels = list(intervals)
    fig, axes = plt.subplots(
        1, len(metrics), figsize=(2.3 * len(metrics) + 1.5, 0.35 * len(labels) + 1.6), sharey=True
    )
    y = np.arange(len(labels))[::-1]
    for ax, metric in zip(np.atleast_1d(axes), metrics, strict=True):
        for yi, label in zip(y, labels, strict=True):
            interval = intervals[label].get(metric)
            if interval is None:
                continue
            low, high = bar_ends(interval)
            ax.errorbar(
                interval.mean,
                yi,
                xerr=[[interval.mean - low], [high - interval.mean]],
                fmt="o",
                color="tab:blue",
                capsize=3,
            )
        ax.set_xlim(*axis_range(ax.get_xlim()))
        ax.set_title(titles[metric], fontsize=10)
        ax.grid(axis="x", alpha=0.3)
        ax.tick_params(axis="x", labelsize=8)
    first = np.atleast_1d(axes)[0]
    first.set_yticks(y, labels)
    fig.suptitle("Final test metrics: mean and 95% Student-t interval over seeds")
    fig.tight_layout()
    return fig
