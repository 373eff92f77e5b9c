"""A post-hoc classifier stage run once, after the last epoch has trained and before it is
evaluated (:func:`choose_post_hoc`), so that the last evaluation, the final metrics, the last
checkpoint and the logged model are the changed classifier's, and a run resumed from that
checkpoint does not choose again. What the stage chooses on the validation split never scores
the row that chose it: the last evaluation's validation metrics are the cross-fitted
predictions (:func:`runner.train.decoupled.cross_fit_table`); a stage that chooses nothing there
(``ncm``) is scored by its own predictions."""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager

import numpy as np
import torch

from runner.train.decoupled import ClassifierInputs
from runner.train.feed import Feed
from runner.train.run import Parts
from runner.train.stages import PostHocChoice, PostHocInputs, PostHocStage
from runner.train.state import autocast

log = logging.getLogger("runner")


def choose_post_hoc(
    parts: Parts, stage: PostHocStage, val_x: Feed | None, train_x: Feed
) -> PostHocChoice:
    """Let ``stage`` change ``parts``'s classifier with what the validation split chooses. Every
    rank reads the whole split (as an evaluation does), in the chunks and precision of an
    evaluation: the model's features once, then the classifier's pass alone for each setting
    tried; the training rows' features only when the stage asks for them."""
    val_y = parts.data.val_y
    # Refused before training without a split, unless the stage chooses nothing on one.
    assert (val_x is not None and val_y is not None) or not stage.reads_validation
    model, per_batch = parts.state.model, parts.trainer.eval_batch_size

    def precision() -> AbstractContextManager[object]:
        return autocast(parts.device)

    def inputs_of(x: Feed) -> ClassifierInputs:
        return ClassifierInputs(model, x.batches(torch.arange(len(x)), per_batch), precision)

    def training() -> tuple[torch.Tensor, torch.Tensor]:
        chunks = inputs_of(train_x).chunks
        features = torch.cat(chunks) if chunks else torch.empty(0, device=parts.device)
        return features.float(), parts.data.train_y.to(features.device)

    if val_x is None or val_y is None:
        validation = PostHocInputs(
            None, np.empty(0, dtype=np.int64), parts.data.train_counts, training, lambda: b""
        )
    else:
        val = inputs_of(val_x)
        validation = PostHocInputs(
            val.predict, val_y.numpy(), parts.data.train_counts, training, val.digest
        )
    choice = stage.choose(model, validation)
    log.info("%s: %s", stage.name, choice.describe())
    return choice
