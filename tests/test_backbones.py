"""Models like the user's: timm and torchvision backbones by name, weights files, the user's own
nn.Module by ``_target_``; every one features then classifier, built by the runner's own path."""

from __future__ import annotations

import time

import pytest
import timm
import torch
from safetensors.torch import save_file
from torch import nn

from runner.app import run
from runner.build import build_model
from runner.checks import check_targets
from runner.errors import UserError
from runner.models import MLP, FeatureClassifier, Predictor, ResNet32, SmallCNN
from runner.train.state import parameter_groups
from tests.conftest import compose_config

QUICK = [
    "data=digits_lt",
    "trainer.epochs=1",
    "trainer.progress=false",
    "tracking.log_model=false",
    "tracking.plots=false",
]
USER_MODULE = '''
import torch
from torch import nn


class TinyNet(nn.Module):
    """A user's module: its own arguments, in_shape and num_classes from the runner."""

    def __init__(self, in_shape, num_classes, width=8):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(int(torch.tensor(in_shape).prod()), width), nn.ReLU())
        self.out = nn.Linear(width, num_classes)

    def forward(self, x):
        return self.out(self.body(x))
'''


def model_of(overrides: list[str], in_shape=(1, 8, 8), num_classes=4) -> FeatureClassifier:
    cfg = compose_config(overrides)
    check_targets(cfg)
    return build_model(cfg.model, in_shape, num_classes)


def assert_contract(model: FeatureClassifier, in_shape) -> None:
    model.eval()
    x = torch.rand(3, *in_shape)
    with torch.no_grad():
        features = model.features(x)
        assert features.shape == (3, model.feature_dim)
        assert torch.equal(model(x), model.classifier(features))


@pytest.mark.unit
@pytest.mark.parametrize("head", ["linear", "cosine"])
@pytest.mark.parametrize("net", [MLP, SmallCNN, ResNet32])
def test_the_small_models_are_features_then_classifier(net, head):
    assert_contract(net((3, 8, 8), 5, head=head), (3, 8, 8))


@pytest.mark.unit
@pytest.mark.parametrize(
    "overrides",
    [
        ["model=timm", "model.name=resnet18"],
        ["model=torchvision", "model.name=resnet18", "model.head=cosine"],
        ["model=custom", "model._target_=torchvision.models.mobilenet_v3_small"],
    ],
)
def test_backbones_are_features_then_classifier(overrides):
    model = model_of(overrides, in_shape=(3, 16, 16))
    assert_contract(model, (3, 16, 16))
    assert model(torch.rand(2, 3, 16, 16)).shape == (2, 4)


@pytest.mark.unit
@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_model_weights_loads_exactly_the_files_tensors(tmp_path, suffix):
    torch.manual_seed(1)
    source = timm.create_model(
        "resnet18", num_classes=1000, in_chans=3
    )  # the file's own classifier
    file = tmp_path / f"resnet18{suffix}"
    state = {k: v.contiguous() for k, v in source.state_dict().items()}
    save_file(state, str(file)) if suffix == ".safetensors" else torch.save(state, file)
    torch.manual_seed(2)  # a different draw: every tensor compared must come from the file
    model = model_of(["model=timm", "model.name=resnet18", f"model.weights={file}"])
    backbone = model.features[1].state_dict()
    assert set(backbone) == set(state) - {"fc.weight", "fc.bias"}
    assert all(torch.equal(backbone[k], state[k]) for k in backbone)
    assert model.unit_input  # pretrained: standardised as the weights' data config says
    adapter = model.features[0]
    assert adapter.size == (224, 224) and torch.allclose(
        adapter.mean.flatten(), torch.tensor([0.485, 0.456, 0.406])
    )
    assert model.features(torch.rand(2, 1, 8, 8)).shape == (2, 512)  # grey repeated, resized


@pytest.mark.unit
def test_a_weights_file_that_does_not_fit_is_refused(tmp_path):
    file = tmp_path / "resnet34.pt"
    torch.save(timm.create_model("resnet34", num_classes=0).state_dict(), file)
    with pytest.raises(
        UserError, match=r"model.weights=.* does not fit the model: \d+ tensors missing"
    ):
        model_of(["model=timm", "model.name=resnet18", f"model.weights={file}"])


@pytest.mark.unit
def test_pretrained_without_the_hub_fails_at_once(monkeypatch):
    # This machine has no network; where it has one, the hub is made unreachable all the same.
    monkeypatch.setattr("runner.models.backbones.reachable", lambda host: False)
    start = time.monotonic()
    with pytest.raises(UserError, match="cannot reach huggingface.co.*model.weights=") as error:
        model_of(["model=timm", "model.name=resnet18", "model.pretrained=true"])
    assert time.monotonic() - start < 30 and len(str(error.value).splitlines()) <= 2


@pytest.mark.unit
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model=custom"], "model=custom needs your module's class: model._target_="),
        (["model._target_=torchvision.models.resnet18"], "model=custom model._target_=<its class>"),
        (["model=timm", "model.name=resnet_18"], "did you mean resnet18"),
        (["model=custom", "model._target_=torch.nn.Flatten"], "takes no num_classes"),
        (["model=mlp", "model.head=cos"], "model.head"),
        (["model=custom", "model._target_=torch.nn.Identity"], "no final nn.Linear"),
    ],
)
def test_a_model_mistake_is_one_teaching_line(overrides, message):
    with pytest.raises(UserError, match=message) as error:
        model_of(overrides)
    assert len(str(error.value).splitlines()) <= 2


@pytest.mark.unit
def test_backbone_lr_is_a_factor_on_the_features_rate():
    cfg = compose_config(["model=timm", "trainer.backbone_lr=0.1", "trainer.lr=0.2"])
    model = build_model(cfg.model, (1, 8, 8), 4)
    features, classifier = parameter_groups(model, cfg.trainer)
    assert features["lr"] == pytest.approx(0.02) and "lr" not in classifier  # the optimizer's lr
    assert len(features["params"]) + len(classifier["params"]) == len(list(model.parameters()))


@pytest.mark.unit
def test_the_logged_model_applies_the_backbones_preprocessing(tmp_path):
    file = tmp_path / "w.pt"
    torch.save(timm.create_model("resnet18", num_classes=0).state_dict(), file)
    model = model_of(["model=timm", f"model.weights={file}"], in_shape=(3, 8, 8)).eval()
    images = torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8)
    predictor = Predictor(model, ([0.0] * 3, [1.0] * 3))  # as the runner scales for unit_input
    with torch.no_grad():
        resized = nn.functional.interpolate(
            images / 255.0, size=(224, 224), mode="bilinear", antialias=True
        )
        mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
        expected = model.classifier(
            model.features[1]((resized - mean[:, None, None]) / std[:, None, None])
        )
        assert torch.allclose(predictor(images), expected, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "above"),
    [
        (["model=timm", "model.name=resnet18", "model.pretrained=false"], 0.1),
        # torchvision's resnet18 from scratch stays at chance after 8 steps on digits: it must
        # train to the end, its accuracy no proof of learning.
        (["model=torchvision", "model.name=resnet18"], 0.0),
        (["model=custom", "model._target_=user_nets.TinyNet", "+model.width=16"], 0.1),
    ],
    ids=["timm", "torchvision", "custom"],
)
def test_each_kind_of_model_trains_on_digits(overrides, above, tmp_path, tracking_uri, monkeypatch):
    (tmp_path / "user_nets.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))  # a file on PYTHONPATH
    monkeypatch.chdir(tmp_path)
    summary = run(compose_config([*QUICK, *overrides, f"tracking.uri={tracking_uri}"]))
    assert summary["final/accuracy"] > above  # 0.1: above chance (10 balanced test classes)


# The state dict names of the previous release, when the small models were one nn.Sequential
# (MLP, SmallCNN) or stem / blocks / head (ResNet32): their checkpoints must still resume.
PREVIOUS_NAMES = {
    MLP: lambda k: k.replace("features.", "").replace("classifier", "5"),
    SmallCNN: lambda k: k.replace("features.", "").replace("classifier", "14"),
    ResNet32: lambda k: k.replace("features.", "").replace("classifier", "head"),
}


@pytest.mark.unit
@pytest.mark.parametrize("model_class", [MLP, SmallCNN, ResNet32], ids=lambda c: c.__name__)
def test_a_state_dict_of_the_previous_layout_loads_the_same_model(model_class):
    torch.manual_seed(0)
    trained = model_class((3, 8, 8), 10).eval()
    previous = {PREVIOUS_NAMES[model_class](k): v for k, v in trained.state_dict().items()}
    assert not any(k.startswith(("features.", "classifier.")) for k in previous)
    torch.manual_seed(1)
    loaded = model_class((3, 8, 8), 10).eval()
    loaded.load_state_dict(previous)  # strict: every key found
    x = torch.randn(4, 3, 8, 8)
    assert torch.equal(loaded(x), trained(x))


@pytest.mark.unit
@pytest.mark.parametrize("model_class", [MLP, SmallCNN, ResNet32], ids=lambda c: c.__name__)
@pytest.mark.parametrize("head", ["linear", "cosine"])
def test_a_model_pickled_in_the_previous_layout_unpickles_to_the_same_model(model_class, head):
    """An MLflow model an earlier run logged is a pickle of the module as it was then: its
    children in the old layout. Unpickling (``__setstate__`` on a bare instance) rebuilds
    features and classifier from them."""
    torch.manual_seed(0)
    trained = model_class((3, 8, 8), 10, head=head).eval()
    state = dict(trained.__dict__)
    if model_class is ResNet32:
        features = trained.features
        children = {"stem": features.stem, "blocks": features.blocks, "head": trained.classifier}
    else:
        children = {str(i): layer for i, layer in enumerate(trained.features)}
        children[str(len(children))] = trained.classifier
    state["_modules"] = children
    del state["feature_dim"]
    restored = model_class.__new__(model_class)
    restored.__setstate__(state)
    x = torch.randn(4, 3, 8, 8)
    assert torch.equal(restored(x), trained(x))
    assert restored.feature_dim == trained.feature_dim
