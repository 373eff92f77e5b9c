"""What the training core writes a run's record to: the :class:`Recorder` protocol, which the
MLflow side implements (:class:`runner.tracking.Tracker` on the process that records, a
:class:`runner.tracking.Bystander` on the other ranks), and the per-class tables it writes
instead of a metric key per class when a dataset has many classes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from runner.train.settings import TrackingConfig

Row = tuple[str, float, int, int]  # a metric: key, value, timestamp (ms), step


class Recorder(Protocol):
    """A run's record, as the loop, the prefix sharing and the results write it."""

    run_id: str
    run_name: str

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_rows(self, rows: list[Row]) -> None: ...

    def last_step(self, key: str) -> int | None: ...

    def set_tags(self, tags: Mapping[str, str]) -> None: ...

    def log_artifacts(self, files: Mapping[str, Any]) -> None: ...

    def finish(self, status: str = "FINISHED") -> None: ...

    def where(self) -> str: ...

    def log_inputs(self, datasets: list[Any]) -> None: ...

    def log_table(self, name: str, table: dict[str, list[Any]]) -> None: ...

    def log_model(
        self,
        model: torch.nn.Module,
        example: Any,
        class_names: list[str],
        register: str | None,
        step: int,
    ) -> None: ...


def per_class_as_table(tracking: TrackingConfig, num_classes: int) -> bool:
    """Whether per-class values go into tables: above ``tracking.per_class_max`` classes a
    metric key per class and value would be thousands of columns in MLflow's UI."""
    return num_classes > tracking.per_class_max


def class_table(class_names: Sequence[str], columns: dict[str, Any]) -> dict[str, list[Any]]:
    """Per-class values as one table (``{"class": names, column: values}``), the form many
    classes are recorded in instead of a metric key per class and value.

    Example:
        >>> class_table(["cat", "dog"], {"test/recall": np.array([0.5, 1.0])})
        {'class': ['cat', 'dog'], 'test/recall': [0.5, 1.0]}
    """
    table: dict[str, list[Any]] = {"class": list(class_names)}
    for name, values in columns.items():
        values = np.asarray(values).tolist()
        assert len(values) == len(class_names), name
        table[name] = values
    return table


def read_class_table(payload: dict[str, Any]) -> dict[str, dict[str, float]]:
    """A table as MLflow stores it (``{"columns": [...], "data": [[...], ...]}``) -> column ->
    class -> value."""
    columns = payload["columns"]
    at = {name: i for i, name in enumerate(columns)}
    out: dict[str, dict[str, float]] = {name: {} for name in columns if name != "class"}
    for row in payload["data"]:
        for name in out:
            out[name][str(row[at["class"]])] = float(row[at[name]])
    return out


def sampling_keys(
    stats: Any, target: torch.Tensor, class_names: list[str], per_class: bool
) -> dict[str, float]:
    """The ``sampling/*`` metrics of an epoch's draw (``stats``: samplers' sampling statistics,
    single- or multi-label) against the ``target`` shares, one key per class when
    ``per_class``."""
    metrics: dict[str, float] = {}
    if per_class:
        for name, share, intended in zip(class_names, stats.shares, target, strict=True):
            metrics[f"sampling/share/{name}"] = float(share)
            metrics[f"sampling/target/{name}"] = float(intended)
    metrics.update(
        {
            "sampling/unique_ratio": stats.unique_ratio,
            "sampling/max_repeats": float(stats.max_repeats),
            "sampling/never_drawn": stats.never_drawn,
            "sampling/kl_to_target": stats.kl_to_target,
            "sampling/imbalance_ratio": stats.imbalance_ratio,
        }
    )
    return metrics
