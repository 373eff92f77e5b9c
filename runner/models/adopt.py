"""Any ``nn.Module`` as a :class:`FeatureClassifier` that computes what the module computes: one
that already exposes ``features``, ``classifier`` and ``feature_dim`` as it is (``feature_dim``
says it means the contract: torchvision's MobileNet has a ``features`` trunk before its
pooling); any other split at its final linear layer (the last ``nn.Linear`` it registers with
``num_classes`` outputs), which becomes ``classifier`` while the module, with an identity in
that layer's place, becomes ``features``, where its forward returns that layer's output."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx
from torch import nn

from runner.models.heads import FeatureClassifier, classifier_head
from runner.models.inputs import first_line


def final_linear(module: nn.Module, out_features: int | None = None) -> str | None:
    """The dotted name of the last ``nn.Linear`` ``module`` registers (with ``out_features``
    outputs, when given), or None."""
    names = [
        name
        for name, layer in module.named_modules()
        if isinstance(layer, nn.Linear)
        and (out_features is None or layer.out_features == out_features)
    ]
    return names[-1] if names else None


def replace_layer(module: nn.Module, name: str, layer: nn.Module) -> nn.Module:
    """Put ``layer`` at dotted ``name`` inside ``module``; returns the layer it replaced."""
    parent_name, _, child = name.rpartition(".")
    parent = module.get_submodule(parent_name) if parent_name else module
    old = parent.get_submodule(child)
    setattr(parent, child, layer)
    return old


def as_feature_classifier(
    model: nn.Module,
    num_classes: int,
    head: str | None,
    target: str,
    in_shape: Sequence[int] | None = None,
) -> FeatureClassifier:
    """``model`` split into features and classifier, computing what ``model``'s own forward
    computes; with ``head`` (linear or cosine; None when ``model`` built its own from
    ``model.head``), a cosine head replaces the classifier it has.

    A split at the final linear layer is used only where it is exact: torch.fx's graph of the
    forward returns that layer's output (its one call), and, given ``in_shape``, the split
    module's output on a seeded probe batch equals the module's own (as it does for one that
    declares ``features``, ``classifier`` and ``feature_dim``). A module that fails either, that
    has no such layer, or that neither check can read is a :class:`ValueError` naming
    ``target``."""
    if isinstance(model, FeatureClassifier):  # the runner's own: built to the contract
        return _with_head(model, num_classes, head)
    probe = _probe(model, in_shape, target)
    if isinstance(getattr(model, "feature_dim", None), int) and all(
        isinstance(getattr(model, a, None), nn.Module) for a in ("features", "classifier")
    ):
        adopted = FeatureClassifier(model.features, model.classifier, model.feature_dim)  # type: ignore[arg-type]
    else:
        name = final_linear(model, num_classes)
        if name is None:
            raise ValueError(
                f"{target} has no final nn.Linear with num_classes={num_classes} outputs to use "
                f"as its classifier; {_FIX}"
            )
        _returns_layer(model, name, target, traced_only=probe is None)
        classifier = replace_layer(model, name, nn.Identity())
        assert isinstance(classifier, nn.Linear)
        adopted = FeatureClassifier(model, classifier, classifier.in_features)
    if probe is not None:
        _same_outputs(adopted, *probe, target)
    return _with_head(adopted, num_classes, head)


def _with_head(adopted: FeatureClassifier, num_classes: int, head: str | None) -> FeatureClassifier:
    if head is not None and head != "linear":
        adopted.classifier = classifier_head(adopted.feature_dim, num_classes, head)
    return adopted


_FIX = (
    "return that layer's output (the logits) from forward, or give the module `features`, "
    "`classifier` and `feature_dim` attributes (docs/your-model.md)"
)


def _returns_layer(model: nn.Module, name: str, target: str, traced_only: bool) -> None:
    """Refuse ``model`` unless its forward, as torch.fx traces it, returns the output of its one
    call of layer ``name``. A forward fx cannot trace passes when the probe is to check it
    (``traced_only`` False), else it is refused too: nothing would tell the split is exact."""
    try:
        graph = torch.fx.symbolic_trace(model).graph
    except Exception as error:  # fx raises many kinds for control flow it cannot follow
        if not traced_only:
            return
        raise ValueError(
            f"{target}: cannot tell whether its forward ends in its final nn.Linear {name!r} "
            f"(torch.fx cannot trace it: {type(error).__name__}); {_FIX}"
        ) from None
    calls = [n for n in graph.nodes if n.op == "call_module" and n.target == name]
    (output,) = (n for n in graph.nodes if n.op == "output")
    returned = _before_no_ops(model, output.args[0], flatten=not traced_only)
    if len(calls) == 1 and returned is calls[0]:
        return
    if len(calls) != 1:
        what = f"calls its final nn.Linear {name!r} {len(calls)} times"
    elif not isinstance(returned, torch.fx.Node):  # several values: a tuple, a dict
        what = (
            f"returns a {type(returned).__name__}, not the output of its final nn.Linear {name!r}"
        )
    else:
        what = f"returns {_step(model, returned)} of its final nn.Linear {name!r}, not that layer's output"
    raise ValueError(
        f"{target}: its forward {what}, so it cannot be split into features and a classifier "
        f"without changing what it computes; {_FIX}"
    )


def _step(model: nn.Module, node: torch.fx.Node) -> str:
    """The operation ``node`` applies: a function's or method's name, a layer's name and class."""
    if node.op == "call_module":
        return f"{node.target} ({type(model.get_submodule(str(node.target))).__name__})"
    return str(getattr(node.target, "__name__", node.target))


# Modules that return their one input as it is in eval mode (dropout: in training it then drops
# the features before the classifier, not the logits after it).
_NO_OPS_AT_EVAL = (
    nn.Identity,
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.AlphaDropout,
    nn.FeatureAlphaDropout,
)


def _before_no_ops(model: nn.Module, value: object, flatten: bool) -> object:
    """What ``value`` (the graph's output) is, back past the trailing modules that change
    nothing in eval mode: :data:`_NO_OPS_AT_EVAL` (timm's heads end in an ``nn.Identity``
    ``flatten``), and with ``flatten`` an ``nn.Flatten()`` (a no-op on the (N, C) logits: only
    where the probe then checks the outputs, since the graph does not hold shapes)."""
    while (
        isinstance(value, torch.fx.Node)
        and value.op == "call_module"
        and len(value.args) == 1
        and not value.kwargs
        and isinstance(value.args[0], torch.fx.Node)
    ):
        layer = model.get_submodule(str(value.target))
        flat = isinstance(layer, nn.Flatten) and (layer.start_dim, layer.end_dim) == (1, -1)
        if not (isinstance(layer, _NO_OPS_AT_EVAL) or (flatten and flat)):
            break
        value = value.args[0]
    return value


PROBE_SEED = 20_011


def _probe(
    model: nn.Module, in_shape: Sequence[int] | None, target: str
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A seeded batch of two ``in_shape`` inputs and ``model``'s outputs on it (eval mode, so no
    statistics change and dropout is off); None without ``in_shape``. A forward that fails on
    it, whatever it raises, is a one-line :class:`ValueError` naming ``target``."""
    if in_shape is None:
        return None
    x = torch.randn(2, *in_shape, generator=torch.Generator().manual_seed(PROBE_SEED))
    try:
        return x, _eval_forward(model, x)
    except Exception as error:  # a layer made for another shape, a size check, a signature
        raise ValueError(
            f"{target} cannot take the data's inputs, one tensor of shape "
            f"(N, {', '.join(map(str, in_shape))}) ({type(error).__name__}: "
            f"{first_line(error)}); build it for inputs of that shape (a model=custom class "
            "is given in_shape; timm's vision transformers take img_size) or change the data"
        ) from None


@torch.no_grad()
def _eval_forward(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    was_training = model.training
    model.eval()
    try:
        out: torch.Tensor = model(x)
    finally:
        model.train(was_training)
    return out


def _same_outputs(
    adopted: FeatureClassifier, x: torch.Tensor, expected: torch.Tensor, target: str
) -> None:
    """Refuse a split whose ``classifier(features(x))`` is not ``expected`` (the same operations
    in the same order: equal up to float rounding)."""
    got = _eval_forward(adopted, x)
    if got.shape == expected.shape and torch.allclose(got, expected, rtol=1e-4, atol=1e-5):
        return
    gap = (got - expected).abs().max().item() if got.shape == expected.shape else float("nan")
    raise ValueError(
        f"{target}: features then classifier compute other outputs than its forward (by up to "
        f"{gap:.3g} on a probe batch), so it cannot be split without changing what it "
        f"computes; {_FIX}"
    )


@torch.no_grad()
def output_width(module: nn.Module, in_shape: tuple[int, ...]) -> int:
    """The length of the vector ``module`` makes of one ``in_shape`` input (a dummy forward in
    eval mode, so that BatchNorm statistics are not touched)."""
    was_training = module.training
    module.eval()
    try:
        out = module(torch.zeros(1, *in_shape))
    finally:
        module.train(was_training)
    if out.dim() != 2:
        raise ValueError(f"features give shape {tuple(out.shape)} per batch, not (N, D)")
    return int(out.shape[1])
