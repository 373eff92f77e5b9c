"""Multi-label runs on the synthetic long tail: class-aware sampling draws each class within its
binomial tolerance of the intended share, and every multi-label strategy trains through the
runner's own epoch (:func:`runner.train.fit.train_epoch`), recording mAP, per-class AP and the
drawn label shares; a binary 95/5 run reports average precision, ROC AUC and the threshold
chosen on the validation split."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, recall_score, roc_auc_score

from runner.config import trainer_config
from runner.data import synthetic_lt
from runner.data.multilabel import MultiLabelData, synthetic_multilabel
from runner.models import MLP
from runner.train.feed import Feed
from runner.train.fit import train_epoch
from runner.train.losses import ClassWeightedLoss
from runner.train.multilabel_evaluation import choose_precision_threshold
from runner.train.multilabel_loop import EpochRecord, train_multilabel
from runner.train.multilabel_losses import DistributionBalancedLoss, MultiLabelBCE
from runner.train.multilabel_run import (
    evaluate_rare_positives,
    multilabel_sampling_metrics,
    positive_class,
    probabilities,
)
from runner.train.state import build_state
from samplers import (
    MultiLabelClassAwareSampler,
    MultiLabelInstanceSampler,
    MultiLabelWeightedSampler,
    Sampler,
    UniformSampler,
)

pytestmark = pytest.mark.unit

# Two-sided normal quantile for a family-wise 1e-4 over 10 classes (Bonferroni: 1e-5 each).
Z = 4.42


@pytest.fixture(scope="module")
def data() -> MultiLabelData:
    return synthetic_multilabel(val_fraction=0.2)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_class_aware_draws_each_class_within_its_binomial_tolerance(
    data: MultiLabelData, seed: int
) -> None:
    """Draws are independent, so the number that carry class c is Binomial(M, q_c) with
    q_c = sum_i p_i y_ic; each class's count lies within Z standard deviations of M q_c."""
    draws = 40_000
    sampler = MultiLabelClassAwareSampler(data.train_y, num_samples=draws, seed=seed)
    q = (sampler.item_probabilities()[:, None] * data.train_y.double()).sum(0)
    stats, shares, target = multilabel_sampling_metrics(
        sampler, sampler.epoch_indices(), data.class_names
    )
    drawn = torch.from_numpy(shares) * stats["sampling/labels_per_draw"] * draws
    tolerance = Z * torch.sqrt(draws * q * (1 - q))
    assert bool(((drawn - draws * q).abs() <= tolerance).all()), (drawn, draws * q)
    assert np.allclose(target, (q / q.sum()).numpy())
    # Class-aware sampling chooses classes uniformly, yet the head keeps far more than a tenth
    # of the drawn labels: tail samples bring it along.
    assert shares[0] > 0.2 and math.isclose(float(shares.sum()), 1.0)


def train(data: MultiLabelData, sampler: Sampler, loss: torch.nn.Module) -> list[EpochRecord]:
    torch.manual_seed(0)
    model = MLP(data.in_shape, data.num_classes, hidden=(64,))
    trainer = trainer_config(epochs=4, batch_size=128, lr=0.1, warmup_epochs=0)
    return train_multilabel(data, model, sampler, loss, trainer, seed=0)


@pytest.mark.parametrize(
    "strategy",
    [MultiLabelInstanceSampler, MultiLabelClassAwareSampler, MultiLabelWeightedSampler],
)
def test_every_multilabel_strategy_trains_and_records(
    data: MultiLabelData, strategy: type[Sampler]
) -> None:
    sampler = strategy(data.train_y, seed=0)
    loss = MultiLabelBCE(data.train_counts, None, 4)
    records = train(data, sampler, loss)
    first, last = records[0].scores, records[-1].scores
    drawn, shares = records[-1].sampling, records[-1].shares
    assert records[-1].mean_loss < records[0].mean_loss
    prevalence = float(data.test_y.double().mean())  # a random ranking's expected AP, roughly
    assert last.test.mAP > 3 * prevalence and last.test.mAP > first.test.mAP
    assert last.val is not None and last.score == last.val.mAP
    assert last.test.thresholds_from == "validation" and last.val.thresholds_from == "fixed"
    metrics = last.test.metrics(data.class_names, "test")
    assert {f"test/ap/{c}" for c in data.class_names} <= set(metrics)
    assert {"test/mAP", "test/few_mAP", "test/micro_f1", "test/macro_f1"} <= set(metrics)
    assert {f"sampling/share/{c}" for c in data.class_names} <= set(drawn)
    assert math.isclose(float(shares.sum()), 1.0)


def test_the_distribution_balanced_loss_trains_with_class_aware_sampling(
    data: MultiLabelData,
) -> None:
    sampler = MultiLabelClassAwareSampler(data.train_y, seed=0)
    loss = DistributionBalancedLoss(data.train_counts, None, 4, train_size=data.train_size)
    records = train(data, sampler, loss)
    assert records[-1].mean_loss < records[0].mean_loss
    assert records[-1].scores.test.mAP > records[0].scores.test.mAP


def test_a_binary_95_5_run_reports_ap_roc_auc_and_the_validation_threshold() -> None:
    data = synthetic_lt(
        num_classes=2, n_max=950, imbalance_factor=19, val_per_class=40, separation=1.5
    )
    assert data.train_counts.tolist() == [950, 50]
    torch.manual_seed(0)
    model = MLP(data.in_shape, data.num_classes, hidden=(32,))
    trainer = trainer_config(epochs=3, batch_size=64, lr=0.05, warmup_epochs=0)
    sampler = UniformSampler(data.train_y, seed=0)
    state = build_state(model, sampler, trainer, seed=0)
    loss = ClassWeightedLoss(data.train_counts, None, 3)
    feed = Feed(data.train_x, torch.device("cpu"))
    for _ in range(3):
        train_epoch(state, feed, data.train_y, loss, 64, None)
    positive = positive_class(data.train_counts)
    test = (Feed(data.test_x, torch.device("cpu")), data.test_y)
    val = (Feed(data.val_x, torch.device("cpu")), data.val_y)
    result = evaluate_rare_positives(model, test, val, positive, 0.9, 256)
    assert positive == 1 and result.val is not None
    scores = probabilities(model, test[0], 256, multi_label=False)[:, 1].numpy()
    truth = (data.test_y == 1).numpy()
    assert abs(result.test.average_precision - average_precision_score(truth, scores)) < 1e-12
    assert abs(result.test.roc_auc - roc_auc_score(truth, scores)) < 1e-12
    val_scores = probabilities(model, val[0], 256, multi_label=False)[:, 1]
    threshold = choose_precision_threshold(val_scores, data.val_y == 1, 0.9)
    assert result.test.threshold == threshold and result.test.thresholds_from == "validation"
    assert result.test.recall == pytest.approx(recall_score(truth, scores >= threshold))
    assert result.val.thresholds_from == "fixed"
    assert result.test.roc_auc > 0.8  # the classes are separable: it learnt something
