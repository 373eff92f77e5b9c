"""Models: an MLP, a small CNN and the CIFAR ResNet-32 of He et al. (2016).

Each ends in one classifier layer, reachable as ``model.classifier`` (the two-stage cRT recipe
re-initialises and retrains it alone): a linear layer, or with ``head="cosine"`` the normalised
(cosine) classifier LDAM is published with."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from runner.data import Normalize, to_model_input

HEADS = ("linear", "cosine")


class Predictor(nn.Module):
    """A trained model as a run logs it: samples as the data stores them in (uint8 images, or
    float features), logits out; the run's own conversion (per-channel standardisation of
    images) comes first, so predictions on the stored test set are the run's."""

    def __init__(self, model: nn.Module, normalize: Normalize | None) -> None:
        super().__init__()
        self.model = model
        self.normalize = (
            tuple(torch.tensor(v, dtype=torch.float32) for v in normalize)
            if normalize is not None
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(to_model_input(x, self.normalize))


class CosineClassifier(nn.Module):
    """Logits ``cos(x, w_j)`` in [-1, 1]: features and class weights normalised to unit length
    (the ``NormedLinear`` head of Cao et al. 2019, whose LDAM loss scales these logits by 30)."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, num_classes))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # The reference initialisation: uniform, then every class column rescaled to norm 1.
        with torch.no_grad():
            self.weight.uniform_(-1, 1).renorm_(2, 1, 1e-5).mul_(1e5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=1) @ F.normalize(self.weight, dim=0)


def classifier_head(in_features: int, num_classes: int, head: str) -> nn.Module:
    if head not in HEADS:
        raise ValueError(f"model.head must be one of {', '.join(HEADS)}, got {head!r}")
    if head == "cosine":
        return CosineClassifier(in_features, num_classes)
    return nn.Linear(in_features, num_classes)


class MLP(nn.Sequential):
    """Flatten, then ``hidden`` ReLU layers, then the classifier."""

    def __init__(
        self,
        in_shape: Sequence[int],
        num_classes: int,
        hidden: Sequence[int] = (256, 256),
        head: str = "linear",
    ) -> None:
        layers: list[nn.Module] = [nn.Flatten()]
        width = math.prod(in_shape)
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU(inplace=True)]
            width = size
        layers.append(classifier_head(width, num_classes, head))
        super().__init__(*layers)

    @property
    def classifier(self) -> nn.Module:
        return self[-1]


def _conv_bn(cin: int, cout: int, stride: int = 1) -> list[nn.Module]:
    return [
        nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    ]


class SmallCNN(nn.Sequential):
    """Three conv-BN-ReLU stages (width, 2x, 4x; stride 2 after the first two), global average
    pooling and the classifier: about 0.3M parameters at ``width=48``."""

    def __init__(
        self, in_shape: Sequence[int], num_classes: int, width: int = 48, head: str = "linear"
    ) -> None:
        if len(in_shape) != 3:
            raise ValueError(
                f"model=small_cnn needs image data (C, H, W), got input shape {tuple(in_shape)}; use model=mlp"
            )
        super().__init__(
            *_conv_bn(in_shape[0], width),
            *_conv_bn(width, 2 * width, 2),
            *_conv_bn(2 * width, 2 * width),
            *_conv_bn(2 * width, 4 * width, 2),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            classifier_head(4 * width, num_classes, head),
        )

    @property
    def classifier(self) -> nn.Module:
        return self[-1]


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.pad = cout - cin  # option A shortcut: subsample and zero-pad channels
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x[:, :, :: self.stride, :: self.stride] if self.stride > 1 else x
        if self.pad:
            shortcut = F.pad(shortcut, (0, 0, 0, 0, self.pad // 2, self.pad - self.pad // 2))
        return F.relu(out + shortcut)


class ResNet32(nn.Module):
    """CIFAR ResNet-32: 3 stages of 5 basic blocks (16, 32, 64 channels), ~0.46M parameters."""

    def __init__(
        self,
        in_shape: Sequence[int],
        num_classes: int,
        blocks_per_stage: int = 5,
        head: str = "linear",
    ) -> None:
        super().__init__()
        if len(in_shape) != 3:
            raise ValueError(
                f"model=resnet32 needs image data (C, H, W), got input shape {tuple(in_shape)}; use model=mlp"
            )
        self.stem = nn.Sequential(*_conv_bn(in_shape[0], 16))
        blocks: list[nn.Module] = []
        cin = 16
        for stage, cout in enumerate((16, 32, 64)):
            for b in range(blocks_per_stage):
                blocks.append(_BasicBlock(cin, cout, 2 if stage > 0 and b == 0 else 1))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = classifier_head(64, num_classes, head)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight)

    @property
    def classifier(self) -> nn.Module:
        return self.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))
