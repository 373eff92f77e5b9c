"""Models and weights as the user gives them: a module is used as its own forward computes or
refused in one line; a weights file that cannot be read safely is refused in two lines naming
it, and a pickle that would run code never runs it."""

from __future__ import annotations

import argparse
import os

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch import nn
from torch.nn import functional as F

from runner.build import build_model
from runner.errors import UserError
from runner.models.adopt import as_feature_classifier
from tests.conftest import compose_config
from tests.helpers.cli import run_cli

pytestmark = pytest.mark.unit

MNIST_NET = '''
import torch
from torch import nn
from torch.nn import functional as F


class Net(nn.Module):
    """pytorch/examples' MNIST network (mnist/main.py): its forward ends in log_softmax."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)
'''


def test_a_module_ending_in_log_softmax_is_refused_in_one_line(tmp_path, monkeypatch):
    (tmp_path / "mnist_net.py").write_text(MNIST_NET)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = compose_config(["model=custom", "model._target_=mnist_net.Net"])
    with pytest.raises(UserError) as error:
        build_model(cfg.model, (1, 28, 28), 10)
    message = str(error.value)
    assert len(message.splitlines()) == 1
    assert (
        "mnist_net.Net" in message and "returns log_softmax of its final nn.Linear 'fc2'" in message
    )


class Branching(nn.Module):
    """A forward torch.fx cannot trace (it branches on a tensor's value); ``log_softmax``
    after the final linear layer, or not."""

    def __init__(self, num_classes: int = 3, log_softmax: bool = True) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU())
        self.fc = nn.Linear(8, num_classes)
        self.log_softmax = log_softmax

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 1e9:  # never, on the data: fx cannot follow it all the same
            x = x / 2
        logits = self.fc(self.body(x))
        return F.log_softmax(logits, dim=1) if self.log_softmax else logits


class Declared(nn.Module):
    """Declares ``features``, ``classifier`` and ``feature_dim``; its forward is ``scale``
    times theirs."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Flatten(), nn.Linear(12, 8))
        self.classifier = nn.Linear(8, 3)
        self.feature_dim = 8
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * self.classifier(self.features(x))


SHAPE = (3, 2, 2)


def test_a_split_that_would_change_the_output_is_refused_by_the_probe_where_fx_cannot_trace():
    with pytest.raises(ValueError, match="other outputs than its forward \\(by up to"):
        as_feature_classifier(Branching(), 3, None, "Branching", SHAPE)
    with pytest.raises(ValueError, match="torch.fx cannot trace it"):
        as_feature_classifier(Branching(log_softmax=False), 3, None, "Branching")  # no shape
    with pytest.raises(ValueError, match="other outputs than its forward"):
        as_feature_classifier(Declared(2.0), 3, None, "Declared", SHAPE)


def dropout_after_logits() -> nn.Module:
    """Dropout after the final linear layer: nothing in eval mode (in training the split drops
    the features instead)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 3), nn.Dropout())


@pytest.mark.parametrize(
    "module",
    [Branching(log_softmax=False), Declared(1.0), dropout_after_logits()],
    ids=["untraceable", "declared", "dropout-after-logits"],
)
def test_a_module_whose_split_is_exact_computes_what_its_forward_computes(module):
    x = torch.randn(5, *SHAPE)
    expected = module.eval()(x)
    adopted = as_feature_classifier(module, 3, None, "module", SHAPE).eval()
    assert torch.allclose(adopted(x), expected, atol=1e-6)
    assert adopted.features(x).shape == (5, 8)


def test_a_timm_head_ending_in_identity_is_split_at_its_classifier():
    """timm's ClassifierHead returns ``self.flatten(fc(x))``, an ``nn.Identity``: built through
    model=custom (timm.create_model, no download), it is split at ``head.fc``."""
    cfg = compose_config(
        [
            "model=custom",
            "model._target_=timm.create_model",
            "+model.model_name=regnetx_002",
            "+model.pretrained=false",
        ]
    )
    torch.manual_seed(0)
    model = build_model(cfg.model, (3, 32, 32), 3).eval()
    x = torch.randn(4, 3, 32, 32)
    assert isinstance(model.classifier, nn.Linear) and model.feature_dim == 368
    assert model.features(x).shape == (4, 368)
    assert torch.equal(model.classifier(model.features(x)), model(x))


def test_dropout_after_the_logits_is_split_without_a_probe_and_log_softmax_still_refused():
    adopted = as_feature_classifier(dropout_after_logits(), 3, None, "drop")  # fx alone
    assert isinstance(adopted.classifier, nn.Linear) and adopted.feature_dim == 8
    with pytest.raises(ValueError, match="returns 2 \\(LogSoftmax\\) of its final nn.Linear '0'"):
        as_feature_classifier(
            nn.Sequential(nn.Linear(12, 3), nn.Dropout(), nn.LogSoftmax(dim=1)), 3, None, "ls"
        )


class TwoInputs(nn.Module):
    def __init__(self, num_classes: int = 3) -> None:
        super().__init__()
        self.fc = nn.Linear(12, num_classes)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.fc((x * mask).flatten(1))


@pytest.mark.parametrize(
    ("module", "shape", "kind"),
    [
        ("vit_tiny_patch16_224", (3, 32, 32), "AssertionError: Input height (32) doesn't match"),
        (TwoInputs(), SHAPE, "TypeError: TwoInputs.forward() missing 1 required positional"),
    ],
    ids=["vit-of-another-size", "two-inputs"],
)
def test_a_module_that_cannot_take_the_inputs_is_one_line_naming_it_and_the_shape(
    module, shape, kind
):
    if isinstance(module, str):
        import timm

        module = timm.create_model(module, pretrained=False, num_classes=3)
    with pytest.raises(ValueError) as error:
        as_feature_classifier(module, 3, None, "my.Net", shape)
    message = str(error.value)
    dims = ", ".join(map(str, shape))
    assert len(message.splitlines()) == 1 and message.startswith(
        f"my.Net cannot take the data's inputs, one tensor of shape (N, {dims}) ({kind}"
    )
    assert "build it for inputs of that shape" in message


def random_bytes(path):
    """4096 bytes of no format, the same in every run (a seeded generator)."""
    path.write_bytes(np.random.default_rng(4096).bytes(4096))
    return path


class Planted:
    """A pickle whose loading would run a shell command (creating ``marker``)."""

    def __init__(self, marker) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def timm_with(weights) -> None:
    cfg = compose_config(["model=timm", "model.name=resnet18", f"model.weights={weights}"])
    build_model(cfg.model, (3, 8, 8), 4)


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_a_weights_file_of_random_bytes_is_two_lines_naming_it(tmp_path, suffix):
    file = random_bytes(tmp_path / f"weights{suffix}")
    with pytest.raises(UserError) as error:
        timm_with(file)
    lines = str(error.value).splitlines()
    assert len(lines) == 2 and f"model.weights={file}: cannot be read as" in lines[0]
    assert "weights_only" not in str(error.value)


def test_a_pickle_that_would_run_code_is_refused_and_nothing_runs(tmp_path):
    marker, file = tmp_path / "ran", tmp_path / "weights.pt"
    torch.save({"conv1.weight": Planted(marker)}, file)
    with pytest.raises(UserError) as error:
        timm_with(file)
    message = str(error.value)
    assert not marker.exists()
    assert len(message.splitlines()) == 2 and f"model.weights={file}: refused" in message
    assert "names posix.system, of module posix, which a safe load blocks outright" in message
    assert "weights_only" not in message


def qualified(function) -> str:
    return f"{function.__module__}.{function.__name__}"


@pytest.mark.parametrize(
    ("extra", "name"),
    [
        (argparse.Namespace(lr=0.1, epochs=90), "argparse.Namespace"),
        (np.float64(0.75), qualified(np.float64(0.75).__reduce__()[0])),  # numpy's own name
    ],
)
def test_a_checkpoint_with_a_harmless_global_is_refused_without_torchs_advice(
    tmp_path, extra, name
):
    """A training checkpoint beside the weights (its arguments, a numpy accuracy) names a
    global a safe load does not construct: the message says which and how to save, and neither
    claims the file would run code nor advises allowlisting it or loading it unsafely."""
    import timm

    file = tmp_path / "checkpoint.pt"
    state = timm.create_model("resnet18", num_classes=0).state_dict()
    torch.save({**state, "extra": extra}, file)
    with pytest.raises(UserError) as error:
        timm_with(file)
    first, second = str(error.value).splitlines()
    assert first == (
        f"model.weights={file}: refused: its pickle names {name}, which a safe load "
        "(weights_only=True) does not construct; nothing of it ran"
    )
    assert second.startswith("save the state_dict of tensors alone")
    for advice in ("add_safe_globals", "allowlist", "weights_only=False", "run code"):
        assert advice not in str(error.value)


def test_a_state_dict_saved_as_safetensors_still_loads(tmp_path):
    """The refusals above are of bad files, not of the formats."""
    import timm

    file = tmp_path / "good.safetensors"
    save_file(timm.create_model("resnet18", num_classes=0).state_dict(), str(file))
    timm_with(file)


@pytest.mark.slow
def test_the_cli_refuses_a_planted_pickle_in_two_lines_without_running_it(tmp_path, tracking_uri):
    marker, file = tmp_path / "ran", tmp_path / "weights.pt"
    torch.save({"conv1.weight": Planted(marker)}, file)
    done = run_cli(
        "data=digits_lt",
        "model=timm",
        "model.name=resnet18",
        f"model.weights={file}",
        "trainer.epochs=1",
        cwd=tmp_path,
        uri=tracking_uri,
        timeout=180,
        expect=2,
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) <= 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert str(file) in lines[0] and "weights_only=False" not in done.stderr + done.stdout
    assert not marker.exists()
