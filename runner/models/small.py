"""The models trained from scratch: an MLP, a small CNN and the CIFAR ResNet-32 of He et al.
(2016). Each is a :class:`FeatureClassifier`: ``features``, then one classifier layer (linear,
or with ``head="cosine"`` the normalised classifier LDAM is published with)."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from runner.models.heads import FeatureClassifier, classifier_head


def _read_previous_layout(renames: dict[str, str]) -> Callable[..., None]:
    """A load hook that reads the state dicts these models had before they were ``features``
    then ``classifier`` (checkpoints and logged models of earlier runs): ``renames`` maps an old
    top-level name to its new one; a key already in the new layout is left as it is."""

    def hook(module: nn.Module, state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
        for key in [k for k in state_dict if k.startswith(prefix)]:
            head, _dot, rest = key[len(prefix) :].partition(".")
            if head in renames:
                state_dict[f"{prefix}{renames[head]}.{rest}"] = state_dict.pop(key)

    return hook


def _previous_pickle(
    state: dict[str, Any], features: Callable[[list[nn.Module]], nn.Module]
) -> None:
    """A model pickled before it was ``features`` then ``classifier`` (an MLflow model logged by
    an earlier run) unpickled into today's class: ``state["_modules"]`` rebuilt in place from
    the old children, the last of which was the classifier."""
    children = list(state["_modules"].values())
    head = children[-1]
    weight = head.weight
    state["_modules"] = {"features": features(children[:-1]), "classifier": head}
    state["feature_dim"] = weight.shape[1] if isinstance(head, nn.Linear) else weight.shape[0]


class _SequentialLayout(FeatureClassifier):
    """MLP and SmallCNN were one ``nn.Sequential``: the features' layers, then the classifier."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "features" not in state["_modules"]:
            _previous_pickle(state, lambda layers: nn.Sequential(*layers))
        super().__setstate__(state)


def _sequential_renames(features: nn.Sequential) -> dict[str, str]:
    """The earlier layout was one ``nn.Sequential``: the features' layers, then the classifier."""
    renames = {str(i): f"features.{i}" for i in range(len(features))}
    return {**renames, str(len(features)): "classifier"}


class MLP(_SequentialLayout):
    """Flatten, then ``hidden`` ReLU layers (the features), then the classifier."""

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
        features = nn.Sequential(*layers)
        super().__init__(features, classifier_head(width, num_classes, head), width)
        self.register_load_state_dict_pre_hook(_read_previous_layout(_sequential_renames(features)))


def _conv_bn(cin: int, cout: int, stride: int = 1) -> list[nn.Module]:
    return [
        nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    ]


class SmallCNN(_SequentialLayout):
    """Three conv-BN-ReLU stages (width, 2x, 4x; stride 2 after the first two) and global average
    pooling (the features), then the classifier: about 0.3M parameters at ``width=48``."""

    def __init__(
        self, in_shape: Sequence[int], num_classes: int, width: int = 48, head: str = "linear"
    ) -> None:
        if len(in_shape) != 3:
            raise ValueError(
                f"model=small_cnn needs image data (C, H, W), got input shape {tuple(in_shape)}; use model=mlp"
            )
        features = nn.Sequential(
            *_conv_bn(in_shape[0], width),
            *_conv_bn(width, 2 * width, 2),
            *_conv_bn(2 * width, 2 * width),
            *_conv_bn(2 * width, 4 * width, 2),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        super().__init__(features, classifier_head(4 * width, num_classes, head), 4 * width)
        self.register_load_state_dict_pre_hook(_read_previous_layout(_sequential_renames(features)))


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


class ResNet32(FeatureClassifier):
    """CIFAR ResNet-32: 3 stages of 5 basic blocks (16, 32, 64 channels) and global average
    pooling (the features), then the classifier; ~0.46M parameters."""

    def __init__(
        self,
        in_shape: Sequence[int],
        num_classes: int,
        blocks_per_stage: int = 5,
        head: str = "linear",
    ) -> None:
        if len(in_shape) != 3:
            raise ValueError(
                f"model=resnet32 needs image data (C, H, W), got input shape {tuple(in_shape)}; use model=mlp"
            )
        blocks: list[nn.Module] = []
        cin = 16
        for stage, cout in enumerate((16, 32, 64)):
            for b in range(blocks_per_stage):
                blocks.append(_BasicBlock(cin, cout, 2 if stage > 0 and b == 0 else 1))
                cin = cout
        features = nn.Sequential(
            OrderedDict(
                stem=nn.Sequential(*_conv_bn(in_shape[0], 16)),
                blocks=nn.Sequential(*blocks),
                pool=nn.AdaptiveAvgPool2d(1),
                flatten=nn.Flatten(),
            )
        )
        super().__init__(features, classifier_head(64, num_classes, head), 64)
        previous = {"stem": "features.stem", "blocks": "features.blocks", "head": "classifier"}
        self.register_load_state_dict_pre_hook(_read_previous_layout(previous))
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight)

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "features" not in state["_modules"]:  # pickled as stem, blocks, head: pooled in forward
            _previous_pickle(
                state,
                lambda parts: nn.Sequential(
                    OrderedDict(
                        stem=parts[0],
                        blocks=parts[1],
                        pool=nn.AdaptiveAvgPool2d(1),
                        flatten=nn.Flatten(),
                    )
                ),
            )
        super().__setstate__(state)
