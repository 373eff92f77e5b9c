"""Published results a study is compared with: top-1 error (%) per method on the balanced test
set, as collected by Zhang et al. (2021), "Bag of tricks for long-tailed visual recognition with
deep convolutional neural networks" (AAAI), for CIFAR-LT with imbalance factor 100 and the
ResNet-32 recipe of Cao et al. (2019). Method names are those of ``runner/conf/method/``.

The numbers are those the project's evidence issue (#8) quotes from that table; they were not
re-checked against the paper here (no access offline). Some rows differ from the original papers'
own reports (e.g. Cao et al. 2019 give 22.97 for LDAM-DRW on CIFAR-10-LT); these are the
collected table's, as quoted.

BagofTricks-LT's repository (documents/trick_gallery.md) reports other numbers for some of
these methods, on Cui et al.'s CIFAR-LT files (e.g. 29.35 for progressive sampling on
CIFAR-10-LT); the numbers here are the ones quoted above, not those.

The recipes a row is compared with follow the references' code: ``drw`` and ``ldam_drw`` divide
a batch's weighted loss by its sum of weights (kaidic/LDAM-DRW's ``F.cross_entropy(weight=)``),
``progressive`` is Kang et al.'s schedule, fully class-balanced in the last epoch (BagofTricks-LT
uses e/T for the 1-based epoch e, at most 1/T from it), and ``class_balanced`` is class-balanced
re-sampling (q=0), not Cui et al.'s class-balanced loss (``loss=cb_ce``).

A study names its table with ``tracking.reference`` (runner/conf/experiment/cifar10_lt_paper.yaml);
the report then puts each method's measured error beside the published one."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reference:
    """One published table: ``errors`` maps a method to its top-1 error in percent."""

    title: str
    recipe: str
    errors: dict[str, float]


_SOURCE = "Zhang et al. 2021 (Bag of Tricks), table of re-sampling and two-stage methods"
_RECIPE = "ResNet-32, 200 epochs, batch 128, SGD lr 0.1, lr x0.01 at 160 and x0.0001 at 180"

PUBLISHED = {
    "cifar10_lt_if100": Reference(
        f"CIFAR-10-LT, imbalance 100 ({_SOURCE})",
        _RECIPE,
        {
            "ce": 29.64,
            "class_balanced": 27.55,
            "sqrt": 28.58,
            "progressive": 28.02,
            "drs": 24.93,
            "crt": 25.01,
            "drw": 25.18,
            "ldam_drw": 22.27,
            "balanced_softmax": 22.46,
        },
    ),
    "cifar100_lt_if100": Reference(
        f"CIFAR-100-LT, imbalance 100 ({_SOURCE})",
        _RECIPE,
        {
            "ce": 61.68,
            "class_balanced": 64.76,
            "drs": 59.36,
            "ldam_drw": 57.53,
            "balanced_softmax": 57.01,
        },
    ),
}
