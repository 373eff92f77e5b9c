"""Runs recorded before the losses moved (``runner.losses.X`` -> ``runner.train.losses.X``) keep
their fingerprint, and their recorded config is read back with the new path."""

from __future__ import annotations

import pytest
from hydra.utils import get_class
from omegaconf import OmegaConf

from runner.fingerprint import config_key, config_keys, moved_targets
from tests.conftest import compose_config

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("loss", ["ce", "ldam", "focal"])
def test_a_config_recorded_with_the_old_loss_path_has_the_same_fingerprint(loss):
    cfg = compose_config([f"loss={loss}"])
    target = cfg.loss._target_
    assert target.startswith("runner.train.losses.")
    recorded = OmegaConf.create(OmegaConf.to_container(cfg))
    recorded.loss._target_ = target.replace("runner.train.losses.", "runner.losses.")
    assert config_key(recorded) == config_key(cfg)
    assert config_keys(recorded) == config_keys(cfg)
    other = OmegaConf.create(OmegaConf.to_container(cfg))
    other.loss._target_ = "runner.train.losses.SomethingElse"  # still a different config
    assert config_key(other) != config_key(cfg)


def test_a_recorded_config_is_read_back_with_the_new_paths():
    plain = {"loss": {"_target_": "runner.losses.LDAMLoss", "scale": 30}, "seed": 0}
    moved = moved_targets(plain)
    assert moved["loss"] == {"_target_": "runner.train.losses.LDAMLoss", "scale": 30}
    assert get_class(moved["loss"]["_target_"]).__name__ == "LDAMLoss"


def test_a_config_naming_the_old_loss_path_is_told_the_new_one():
    """A YAML saved before the move (an experiment file, a run's .hydra/config.yaml) gets one
    line naming the key, the old path and the new one, not an import error."""
    from runner.checks import check_targets
    from runner.errors import UserError

    cfg = compose_config(["loss=ldam"])
    cfg.loss._target_ = "runner.losses.LDAMLoss"
    with pytest.raises(UserError) as refused:
        check_targets(cfg)
    assert str(refused.value) == (
        "config error at 'loss._target_': 'runner.losses.LDAMLoss' has moved; use "
        "'runner.train.losses.LDAMLoss'"
    )
