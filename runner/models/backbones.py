"""Backbones by name: timm's (``model=timm``) and torchvision's (``model=torchvision``), from
scratch, pretrained or from a weights file, each as a :class:`FeatureClassifier` whose features
start with the :class:`InputAdapter` its weights need.

A backbone with weights (timm's ``pretrained`` or ``weights``, torchvision's ``weights``) takes
images as its weights were trained on: 3 channels (grey repeated), resized to its data config's
input size, standardised with its mean and std (the model's ``unit_input``: the runner then only
scales uint8 images to [0, 1]). A backbone from scratch takes the data as the small models do
(standardised with the data's own channel statistics, at its own size): a from-scratch resnet18
on 8x8 digits is not blown up to 224 pixels. ``image_size`` resizes either kind."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from runner.models.adopt import final_linear, output_width, replace_layer
from runner.models.heads import FeatureClassifier, classifier_head
from runner.models.inputs import InputAdapter, first_line, load_weights, reachable

WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors")


def names_a_file(weights: str) -> bool:
    """Whether ``model.weights`` names a file of weights (a known suffix, a folder in it, or a
    path that exists) rather than one of torchvision's weights enum members.

    >>> names_a_file("DEFAULT"), names_a_file("weights/lite0.safetensors")
    (False, True)
    """
    return Path(weights).suffix in WEIGHT_SUFFIXES or "/" in weights or Path(weights).exists()


def _image_shape(in_shape: Sequence[int], group: str) -> tuple[int, int, int]:
    if len(in_shape) != 3:
        raise ValueError(
            f"model={group} needs image data (C, H, W), got input shape {tuple(in_shape)}; use model=mlp"
        )
    return in_shape[0], in_shape[1], in_shape[2]


def _known_name(name: str, names: list[str], group: str) -> None:
    if name not in names:
        close = difflib.get_close_matches(name, names, n=3)
        raise ValueError(
            f"model.name={name!r} is not a {group} model"
            + (f"; did you mean {', '.join(close)}?" if close else "")
        )


def _size(image_size: int | None, default: Sequence[int] | None) -> tuple[int, int] | None:
    if image_size is not None:
        if image_size < 1:
            raise ValueError(f"model.image_size must be >= 1 pixels (or null), got {image_size}")
        return image_size, image_size
    return (int(default[0]), int(default[1])) if default is not None else None


def _assemble(
    adapter: InputAdapter,
    backbone: nn.Module,
    in_shape: tuple[int, int, int],
    num_classes: int,
    head: str,
    unit_input: bool,
    what: str,
) -> FeatureClassifier:
    features = nn.Sequential(adapter, backbone)
    try:
        dim = output_width(features, in_shape)
    except Exception as error:  # an input too small for its strides, a ViT's size check
        raise ValueError(
            f"{what} cannot take {in_shape} inputs ({type(error).__name__}: {first_line(error)}); "
            "resize them with model.image_size=<pixels>"
        ) from None
    model = FeatureClassifier(features, classifier_head(dim, num_classes, head), dim)
    model.unit_input = unit_input
    return model


def timm_backbone(
    name: str,
    num_classes: int,
    in_shape: Sequence[int],
    pretrained: bool = False,
    weights: str | None = None,
    image_size: int | None = None,
    head: str = "linear",
) -> FeatureClassifier:
    """timm's ``name`` (``timm.create_model(name, num_classes=0)``: pooled features), with
    ``pretrained`` weights from the Hugging Face hub or a ``weights`` file (a state dict or
    safetensors file, loaded strictly; its classifier tensors, if any, are left out), then a
    ``head`` classifier for ``num_classes``."""
    import timm
    from timm.data.config import resolve_model_data_config

    shape = _image_shape(in_shape, "timm")
    _known_name(name, timm.list_models(), "timm")
    with_weights = pretrained or weights is not None
    download = pretrained and weights is None
    if download and not reachable("huggingface.co"):
        raise ValueError(
            f"model.pretrained=true: cannot reach huggingface.co for {name}'s weights; give them "
            "as a file, model.weights=<state dict or .safetensors>, or set model.pretrained=false"
        )
    channels = 3 if with_weights else shape[0]
    backbone = timm.create_model(name, pretrained=download, num_classes=0, in_chans=channels)
    if weights is not None:
        pretrained_cfg: dict[str, Any] = getattr(backbone, "pretrained_cfg", {})
        load_weights(backbone, weights, skip=pretrained_cfg.get("classifier"))
    config = resolve_model_data_config(backbone)
    size = _size(image_size, config["input_size"][1:] if with_weights else None)
    stats: dict[str, Any] = {"mean": config["mean"], "std": config["std"]} if with_weights else {}
    adapter = InputAdapter(channels, size, **stats)
    return _assemble(adapter, backbone, shape, num_classes, head, with_weights, f"timm {name}")


def torchvision_backbone(
    name: str,
    num_classes: int,
    in_shape: Sequence[int],
    weights: str | None = None,
    image_size: int | None = None,
    head: str = "linear",
) -> FeatureClassifier:
    """torchvision's ``name`` (``torchvision.models.get_model``), from scratch or with
    ``weights``: an enum member of the model's weights (``DEFAULT``, ``IMAGENET1K_V1``, ...,
    downloaded or from torch's hub cache) or a file (a state dict or safetensors file, loaded
    strictly; its classifier tensors are left out). Its final linear layer gives way to a
    ``head`` classifier for ``num_classes``."""
    from torchvision import models

    shape = _image_shape(in_shape, "torchvision")
    if shape[0] not in (1, 3):
        raise ValueError(
            f"model=torchvision takes 3-channel or grey images, got {shape[0]} channels"
        )
    _known_name(name, models.list_models(module=models), "torchvision")
    enums = models.get_model_weights(name)
    is_file = weights is not None and names_a_file(weights)
    enum = None
    if weights is not None and not is_file:
        if weights not in enums.__members__:
            raise ValueError(
                f"model.weights={weights!r} is neither a file nor one of {name}'s weights "
                f"{sorted(enums.__members__)}"
            )
        enum = enums[weights]
        cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(enum.url).name
        if not cached.is_file() and not reachable("download.pytorch.org"):
            raise ValueError(
                f"model.weights={weights}: cannot reach download.pytorch.org and {cached} is not "
                "there; give the weights as a file, model.weights=<state dict or .safetensors>"
            )
    backbone = models.get_model(name, weights=enum)
    final = final_linear(backbone)
    if final is None:
        raise ValueError(f"torchvision {name} ends in no linear layer to replace; choose another")
    replace_layer(backbone, final, nn.Identity())
    if is_file:
        assert weights is not None
        load_weights(backbone, weights, skip=final)
    size: tuple[int, int] | None = None
    stats: dict[str, Any] = {}
    if weights is not None:
        transform = (enum or enums.DEFAULT).transforms()
        size = _size(
            image_size,
            transform.crop_size * 2 if len(transform.crop_size) == 1 else transform.crop_size,
        )
        stats = {"mean": transform.mean, "std": transform.std}
    else:
        size = _size(image_size, None)
    adapter = InputAdapter(3, size, **stats)
    return _assemble(
        adapter, backbone, shape, num_classes, head, weights is not None, f"torchvision {name}"
    )


class FrozenBackbone(nn.Module):
    """``backbone`` without gradients, in eval mode whatever ``train()`` asks: its BatchNorm
    statistics stay those it was loaded with and its dropout stays off."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone.requires_grad_(False).eval()

    def train(self, mode: bool = True) -> FrozenBackbone:
        super().train(mode)
        self.backbone.eval()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.backbone(x)
