"""Figures logged with every run (matplotlib, Agg backend)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def confusion_matrix_figure(
    confusion: np.ndarray, class_names: list[str], title: str = ""
) -> Figure:
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
    ax.set_title(
        f"{title}: confusion matrix (row-normalised)"
        if title
        else "Confusion matrix (row-normalised)"
    )
    fig.colorbar(image, ax=ax, fraction=0.046)
    return fig


def per_class_accuracy_figure(
    recall: np.ndarray, train_counts: np.ndarray, class_names: list[str], title: str = ""
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
    ax.set_title(f"{title}: per-class test accuracy" if title else "Per-class test accuracy")
    return fig


def sampled_shares_figure(
    drawn: np.ndarray, target: np.ndarray, class_names: list[str], title: str = ""
) -> Figure:
    """Drawn (solid) against intended (dashed) class shares, epoch by epoch (epochs x classes).
    Beyond 12 classes the lines would be unreadable: then the tail classes (the last third)
    are summed into one pair of lines, and so are the head and middle."""
    epochs = np.arange(1, drawn.shape[0] + 1)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if len(class_names) <= 12:
        groups = [([c], name) for c, name in enumerate(class_names)]
    else:
        thirds = np.array_split(np.arange(len(class_names)), 3)
        groups = [
            (list(part), f"{label} ({len(part)} classes)")
            for part, label in zip(thirds, ("head", "middle", "tail"), strict=True)
        ]
    colours = plt.get_cmap("tab20" if len(groups) > 10 else "tab10")
    for i, (members, label) in enumerate(groups):
        colour = colours(i % colours.N)
        ax.plot(epochs, drawn[:, members].sum(1), color=colour, marker=".", label=label)
        ax.plot(epochs, target[:, members].sum(1), color=colour, linestyle="--")
    ax.set_xlabel("epoch")
    ax.set_ylabel("share of the epoch's samples")
    ax.set_xlim(1, max(epochs[-1], 2))
    ax.set_ylim(bottom=0)
    name = f"{title}: " if title else ""
    ax.set_title(f"{name}class shares drawn (solid) vs intended (dashed)")
    ax.legend(loc="center left", bbox_to_anchor=(1, 0.5), fontsize=8)
    return fig


def precision_recall_figure(
    precision: np.ndarray,
    recall: np.ndarray,
    average_precision: float,
    chosen: tuple[float, float, float] | None,
    title: str = "",
) -> Figure:
    """The test split's precision-recall curve (one point per distinct score, as a step), its
    average precision, and ``chosen``: (threshold, precision, recall) at the threshold chosen
    on the validation split, marked."""
    fig, ax = plt.subplots(figsize=(5, 4.5))
    ax.step(recall, precision, where="post", label=f"test (AP {average_precision:.3f})")
    if chosen is not None:
        threshold, at_precision, at_recall = chosen
        ax.plot(
            [at_recall],
            [at_precision],
            "o",
            color="C3",
            label=f"threshold {threshold:.3f} (chosen on validation)",
        )
    ax.set_xlim(0, 1.01)
    ax.set_ylim(0, 1.01)
    ax.set_xlabel("recall")
    ax.set_ylabel("precision")
    ax.legend(loc="lower left")
    ax.set_title(f"{title}: precision-recall, rare class" if title else "Precision-recall")
    fig.tight_layout()
    return fig
