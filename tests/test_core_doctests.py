"""The examples in the docstrings of the training core, the data helpers and the race run as
written."""

from __future__ import annotations

import doctest
import importlib

import pytest

pytestmark = pytest.mark.unit

WITH_EXAMPLES = (
    "experiments.race.job_configs",
    "runner.data.samples",
    "runner.files",
    "runner.models.source",
    "runner.quick_exit",
    "runner.reused_builds",
    "runner.train.decoupled",
    "runner.train.feature_bank",
    "runner.train.features",
    "runner.train.recorder",
    "runner.train.refit",
    "runner.train.optimizer_steps",
    "runner.train.stages",
    "runner.tracking.datasets",
)


@pytest.mark.parametrize("name", WITH_EXAMPLES)
def test_the_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
