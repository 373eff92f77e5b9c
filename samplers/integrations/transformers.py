"""The Hugging Face Trainer: a mixin that trains with a samplers sampler and feeds it back.

Imports ``transformers``; ``pip install 'samplerlab[transformers]'``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from samplers.base import Sampler
from samplers.integrations import update_across_ranks
from samplers.integrations.accelerate import tell_sampler

__all__ = ["SamplerTrainerMixin"]


class SamplerTrainerMixin:
    """Mix into ``transformers.Trainer``, before it: ``class MyTrainer(SamplerTrainerMixin,
    Trainer)``, then ``MyTrainer(..., train_sampler=sampler)``.

    * An index sampler becomes the training loader's ``sampler=`` (the Trainer's documented
      override, ``_get_train_sampler``); a batch sampler its ``batch_sampler=``. The Trainer
      prepares the loader with Accelerate, which deals out whole batches of the global draw
      to the processes (the sampler is told so: ``loader_shards``), and sets the sampler's
      epoch each epoch.
    * Feedback: each example carries its dataset index under ``index_key`` (default
      ``"index"``), which is kept through the Trainer's column filtering and out of the
      model's inputs. After each training forward pass, the per-sample cross-entropy of the
      model's ``logits`` against the batch's ``labels`` (``reduction="none"``) goes, with the
      indices, from every process to the sampler (:func:`~samplers.integrations.update_across_ranks`).
      Strategies without feedback skip this.
    """

    train_sampler: Sampler
    index_key: str

    def __init__(
        self, *args: Any, train_sampler: Sampler, index_key: str = "index", **kwargs: Any
    ) -> None:
        if not isinstance(train_sampler, Sampler):
            raise ValueError(
                f"train_sampler must be a samplers.Sampler, got {type(train_sampler).__name__}; "
                "pass one of the samplers package's strategies (an index or a batch sampler)"
            )
        self.train_sampler, self.index_key = train_sampler, index_key
        super().__init__(*args, **kwargs)

    def _get_train_sampler(self, train_dataset: Any = None) -> Sampler:
        return self.train_sampler

    def get_train_dataloader(self) -> DataLoader[Any]:
        if self.train_sampler.batch_size is None:
            loader: DataLoader[Any] = super().get_train_dataloader()  # type: ignore[misc]
            tell_sampler(loader)
            return loader
        trainer: Any = self
        dataset = trainer.train_dataset
        collate = trainer._get_collator_with_removed_columns(
            trainer.data_collator, description="Training"
        )
        batches = DataLoader(
            dataset,
            batch_sampler=self.train_sampler,
            collate_fn=collate,
            num_workers=trainer.args.dataloader_num_workers,
            pin_memory=trainer.args.dataloader_pin_memory,
            persistent_workers=trainer.args.dataloader_persistent_workers,
        )
        prepared: DataLoader[Any] = trainer.accelerator.prepare(batches)
        tell_sampler(prepared)
        return prepared

    def _set_signature_columns_if_needed(self) -> None:
        super()._set_signature_columns_if_needed()  # type: ignore[misc]
        columns: list[str] = getattr(self, "_signature_columns", None) or []
        if self.index_key not in columns:
            columns.append(self.index_key)
            self._signature_columns = columns

    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        index = inputs.pop(self.index_key, None)
        labels = inputs.get("labels")
        loss, outputs = super().compute_loss(  # type: ignore[misc]
            model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch
        )
        if model.training and index is not None and labels is not None:
            logits = outputs["logits"] if isinstance(outputs, dict) else outputs.logits
            losses = F.cross_entropy(logits.detach().float(), labels, reduction="none")
            update_across_ranks(self.train_sampler, index, losses)
        return (loss, outputs) if return_outputs else loss
