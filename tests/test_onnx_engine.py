"""``features.engine=onnxruntime``: the exported backbone gives torch's features within the
stated tolerance, shares the bank with torch, and a backbone it cannot run falls back to torch
with one line."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from runner.errors import UserError
from runner.extras import installed
from runner.models.inputs import InputAdapter
from runner.train.features import CHECK_ROWS, extract
from runner.train.feed import Feed
from runner.train.onnx_engine import TOLERANCE, OnnxRuntime, check_engine, difference
from tests.test_feature_bank import frozen_run

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(
        not (installed("onnxruntime") and installed("onnxscript")),
        reason="the onnx extra (onnxruntime, onnxscript) is not installed",
    ),
]

CPU = torch.device("cpu")


def resized_backbone() -> nn.Module:
    """Images upsampled (antialiased bilinear, as the runner's adapter does), a convolution,
    pooled: the shape of a pretrained backbone's path, small."""
    torch.manual_seed(0)
    return nn.Sequential(
        InputAdapter(3, (24, 24), mean=[0.5, 0.4, 0.3], std=[0.2, 0.25, 0.3]),
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU6(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
    ).eval()


def test_onnxruntime_gives_torchs_features_within_the_tolerance(tmp_path):
    backbone = resized_backbone()
    images = torch.rand(300, 3, 8, 8)  # two batches: all but the first 16 rows by ONNX Runtime
    lines: list[str] = []
    runtime = OnnxRuntime(tmp_path, lines.append)
    by_torch, digests = extract(backbone, Feed(images, CPU))
    by_onnx, again = extract(backbone, Feed(images, CPU), engine=runtime)
    assert lines == [] and digests == again
    assert list(tmp_path.glob("backbone-3x8x8.onnx"))
    assert torch.equal(by_onnx[:CHECK_ROWS], by_torch[:CHECK_ROWS])  # torch's own
    assert 0 < difference(by_torch[CHECK_ROWS:], by_onnx[CHECK_ROWS:]) <= TOLERANCE


class Branchy(nn.Module):
    """A forward that branches on the data: torch's exporter cannot trace it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = x.flatten(1)
        return pooled if pooled.sum() > 0 else -pooled


def test_a_backbone_that_cannot_be_exported_is_computed_by_torch_after_one_line(tmp_path):
    lines: list[str] = []
    images = torch.rand(260, 3, 4, 4)
    features, _ = extract(
        Branchy().eval(), Feed(images, CPU), engine=OnnxRuntime(tmp_path, lines.append)
    )
    assert len(lines) == 1 and lines[0].startswith(
        "features: features.engine=onnxruntime: cannot run the backbone ("
    )
    assert lines[0].endswith("); computing them with torch")
    assert torch.equal(features, images.flatten(1))


def test_a_run_on_onnxruntime_shares_the_bank_with_torch(tmp_path, capsys):
    """The engine is not part of the bank's identity: within the tolerance the rows are the
    same features, so a torch run reuses what an onnxruntime run stored."""
    _, by_onnx = frozen_run(tmp_path, engine="onnxruntime")
    line = capsys.readouterr().out.strip()
    assert line.startswith("features: computed "), line
    (bank,) = {p.parent for p in tmp_path.glob("*/shard-*.pt")}
    assert list(bank.glob("backbone-*.onnx"))
    _, reused = frozen_run(tmp_path, engine="torch")
    assert capsys.readouterr().out.startswith("features: reused ")
    _, by_torch = frozen_run(tmp_path / "torch", engine="torch")
    assert torch.equal(reused.train_x, by_onnx.train_x)
    assert difference(by_torch.train_x, by_onnx.train_x) <= TOLERANCE


def test_an_unknown_engine_is_a_user_error_naming_it():
    with pytest.raises(UserError, match=r"features.engine=tensorrt: not an engine"):
        check_engine("tensorrt")
    check_engine("onnxruntime")  # installed here: no error
