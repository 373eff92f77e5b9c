"""The Hugging Face Trainer with SamplerTrainerMixin, its defaults otherwise."""

from __future__ import annotations

import tempfile
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments

from samplers import FixedClassSampler, HardMinedSampler, Sampler
from samplers.integrations.transformers import SamplerTrainerMixin
from tests.helpers.frameworks.data import BATCH, EPOCHS, Record, dataset, model


class Examples(Dataset[dict[str, Any]]):
    """The shared data as the dict examples the Trainer expects, with each one's index."""

    def __init__(self) -> None:
        self.x, self.y, _ = dataset().tensors

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": self.x[i], "labels": self.y[i], "index": i}


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = model()

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, Any]:
        logits = self.net(x)
        loss = None if labels is None else torch.nn.functional.cross_entropy(logits, labels)
        return {"loss": loss, "logits": logits}


class Recording(SamplerTrainerMixin, Trainer):
    """Records the indices of every training batch, by the Trainer's own epoch count."""

    record: Record
    epoch = -1

    def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        if model.training:
            self.record.batch(self.epoch, inputs["index"])
        return super().compute_loss(model, inputs, *args, **kwargs)


class Epochs(TrainerCallback):
    def __init__(self, trainer: Recording) -> None:
        self.trainer = trainer

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer.epoch += 1

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer.record.epoch_end(self.trainer.train_sampler)


def _train(sampler: Sampler) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        args = TrainingArguments(
            output_dir=folder,
            num_train_epochs=EPOCHS,
            per_device_train_batch_size=BATCH,
            learning_rate=0.1,
            use_cpu=True,
            report_to=[],
            save_strategy="no",
            disable_tqdm=True,
            logging_strategy="no",
        )
        trainer = Recording(
            model=Classifier(), args=args, train_dataset=Examples(), train_sampler=sampler
        )
        trainer.record = Record()
        trainer.add_callback(Epochs(trainer))
        trainer.record.extra["len"] = len(trainer.get_train_dataloader())
        trainer.train()
    return trainer.record.as_json()


def index_sampler_with_feedback() -> dict[str, Any]:
    return _train(HardMinedSampler(dataset().tensors[1], seed=12))


def batch_sampler() -> dict[str, Any]:
    labels = dataset().tensors[1]
    return _train(FixedClassSampler(labels, classes_per_batch=4, samples_per_class=4, seed=13))
