"""Long-tailed data: the built-in sources and yours, the long-tail cut they share, and the form
in which they hand their samples to the runner.

Every source is a function (a Hydra ``_target_`` under ``conf/data/``) returning a
:class:`LongTailData`; besides its own parameters it takes those of the cut
(:class:`LongTailCut`: ``imbalance_factor``, ``profile``, ``data_seed``, ``n_max``,
``val_per_class``, ``val_fraction``) and of the feeding (``in_memory``, ``memory_budget_gb``,
``num_workers``).
"""

from runner.data.batch import augment_batch, to_model_input
from runner.data.builtin import cifar_lt, digits_lt, image_folder_lt, synthetic_lt
from runner.data.cut import LongTailCut, long_tail_counts, long_tail_source, long_tail_subset
from runner.data.samples import SampleError, Samples
from runner.data.types import Augment, Feeding, LongTailData, Normalize
from runner.data.yours import tensor_file, torchvision_lt

__all__ = [
    "Augment",
    "Feeding",
    "LongTailCut",
    "LongTailData",
    "Normalize",
    "SampleError",
    "Samples",
    "augment_batch",
    "cifar_lt",
    "digits_lt",
    "image_folder_lt",
    "long_tail_counts",
    "long_tail_source",
    "long_tail_subset",
    "synthetic_lt",
    "tensor_file",
    "to_model_input",
    "torchvision_lt",
]
