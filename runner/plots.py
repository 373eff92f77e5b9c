"""Figures logged with every run (matplotlib, Agg backend)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def confusion_matrix_figure(confusion: np.ndarray, class_names: list[str]) -> Figure:
    """Row-normalised confusion matrix (each row: how one true class was predicted)."""
    rows = confusion.sum(1, keepdims=True)
    normalised = np.divide(confusion, rows, out=np.zeros(confusion.shape, float), where=rows > 0)
    size = min(4 + 0.35 * len(class_names), 24)
    fig, ax = plt.subplots(figsize=(size, size))
    image = ax.imshow(normalised, cmap="Blues", vmin=0, vmax=1)
    ticks = np.arange(len(class_names))
    show = len(class_names) <= 30
    ax.set_xticks(ticks if show else [], class_names if show else [], rotation=90)
    ax.set_yticks(ticks if show else [], class_names if show else [])
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title("Confusion matrix (row-normalised)")
    fig.colorbar(image, ax=ax, fraction=0.046)
    return fig


def per_class_accuracy_figure(
    recall: np.ndarray, train_counts: np.ndarray, class_names: list[str]
) -> Figure:
    """Test accuracy per class (bars) beside its training count (line, log scale)."""
    fig, ax = plt.subplots(figsize=(max(6, 0.3 * len(class_names)), 4))
    x = np.arange(len(class_names))
    ax.bar(x, recall, color="tab:blue")
    ax.set_ylim(0, 1)
    ax.set_ylabel("test accuracy (recall)")
    ax.set_xticks(x if len(x) <= 30 else [], class_names if len(x) <= 30 else [], rotation=90)
    counts = ax.twinx()
    counts.plot(x, train_counts, color="tab:orange", marker=".")
    counts.set_yscale("log")
    counts.set_ylabel("training samples", color="tab:orange")
    ax.set_title("Per-class accuracy, classes in training-count order")
    return fig


def sampled_shares_figure(
    shares_per_epoch: np.ndarray, target_last: np.ndarray, class_names: list[str]
) -> Figure:
    """Stacked class shares of what was drawn, epoch by epoch."""
    epochs = np.arange(shares_per_epoch.shape[0])
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.stackplot(epochs, shares_per_epoch.T, labels=class_names if len(class_names) <= 12 else None)
    ax.set_xlim(0, max(epochs[-1], 1))
    ax.set_ylim(0, 1)
    ax.set_xlabel("epoch")
    ax.set_ylabel("share of drawn samples")
    ax.set_title(
        f"Sampled class shares (last epoch's target: max {target_last.max():.2f}, min {target_last.min():.3f})"
    )
    if len(class_names) <= 12:
        ax.legend(loc="center left", bbox_to_anchor=(1, 0.5), fontsize=8)
    return fig
