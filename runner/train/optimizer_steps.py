"""Many optimizers stepped as one: the heads trained together (:mod:`runner.train.stacked`)
each keep their own optimizer, and those of equal settings take one step call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from torch.optim.sgd import sgd


def step_optimizers(optimizers: Sequence[torch.optim.Optimizer], alone: bool = False) -> None:
    """Every optimizer's step: the weights and momentum buffers its own ``optimizer.step()``
    would leave. Those that are a plain SGD with one parameter group of equal settings
    (learning rate included) take one call of torch's functional :func:`torch.optim.sgd.sgd`,
    the function ``SGD.step`` calls for each group, on all their parameters at once, in its
    multi-tensor form (SGD's default on a GPU): the same arithmetic on each parameter, on the
    CPU the same weights and buffers bit for bit (tests/test_stacked.py), without a step's fixed
    cost per optimizer, which was a third of an epoch of 30 heads. (With Nesterov momentum the
    multi-tensor form leaves each ``.grad`` changed, as it does on a GPU.) Optimizers that share
    a parameter, and ``alone=True``, step one after the other, each by its own ``step()``.

    Example::

        >>> heads = [torch.nn.Linear(4, 2) for _ in range(3)]
        >>> optimizers = [torch.optim.SGD(h.parameters(), lr=0.1, momentum=0.9) for h in heads]
        >>> for head in heads:
        ...     head(torch.ones(1, 4)).sum().backward()
        >>> step_optimizers(optimizers)
        >>> sorted(len(o.state) for o in optimizers)  # each keeps its momentum buffers
        [2, 2, 2]
    """
    params = [id(p) for opt in optimizers for g in opt.param_groups for p in g["params"]]
    alone = alone or len(set(params)) < len(params)  # one step would see another's update
    together: dict[tuple[object, ...], list[torch.optim.Optimizer]] = {}
    for optimizer in optimizers:
        key = None if alone else _sgd_settings(optimizer)
        if key is None:
            optimizer.step()
        else:
            together.setdefault(key, []).append(optimizer)
    for same in together.values():
        group = same[0].param_groups[0]
        owned = [
            (opt, p) for opt in same for p in opt.param_groups[0]["params"] if p.grad is not None
        ]
        with_grad = [p for _, p in owned]
        momentum = group["momentum"] != 0
        buffers = [opt.state[p].get("momentum_buffer") for opt, p in owned] if momentum else []
        with torch.no_grad():
            sgd(
                with_grad,
                [cast(torch.Tensor, p.grad) for p in with_grad],
                buffers,
                weight_decay=group["weight_decay"],
                momentum=group["momentum"],
                lr=group["lr"],
                dampening=group["dampening"],
                nesterov=group["nesterov"],
                maximize=group["maximize"],
                has_sparse_grad=False,
                foreach=group["foreach"] is not False,
            )
        if momentum:  # the buffers, new or updated, where SGD.step keeps them
            for (opt, p), buffer in zip(owned, buffers, strict=True):
                opt.state[p]["momentum_buffer"] = buffer


def _sgd_settings(optimizer: torch.optim.Optimizer) -> tuple[object, ...] | None:
    """What must be equal for two optimizers to step as one: a plain SGD's single group's
    settings; None for anything else (it steps alone)."""
    if type(optimizer) is not torch.optim.SGD or len(optimizer.param_groups) != 1:
        return None
    group = optimizer.param_groups[0]
    # What SGD.step does not read: the scheduler's initial_lr, the parameters and their names.
    unread = ("params", "initial_lr", "param_names")
    settings = tuple(sorted((k, v) for k, v in group.items() if k not in unread))
    if any(isinstance(v, torch.Tensor) for _, v in settings):
        return None  # a tensor learning rate: SGD.step's own path
    try:
        hash(settings)
    except TypeError:  # a setting torch does not know of, a list, say: not compared here
        return None
    if group["fused"] or group["differentiable"]:
        return None
    if any(p.grad is not None and p.grad.is_sparse for p in group["params"]):
        return None
    return settings
