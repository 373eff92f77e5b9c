"""One rank: runs the named scenarios in order and prints ``RESULT <name> <json>`` for each."""

from __future__ import annotations

import importlib
import json
import sys
import time
import traceback
import warnings

import torch.distributed as dist

DOC_EXAMPLES = ("lightning", "fabric", "accelerate", "transformers", "torchdata")
#: scenario name -> (module in this package, function), in the order they run: the first builds
#: its sampler before any process group exists.
SCENARIOS = {
    "lightning_index": ("lightning_runs", "trainer_index_sampler"),
    "lightning_schedule": ("lightning_runs", "trainer_schedule_sampler"),
    "lightning_batch": ("lightning_runs", "trainer_batch_sampler"),
    "lightning_batch_outside_hook": ("lightning_runs", "trainer_batch_sampler_outside_hook"),
    "lightning_no_distributed_sampler": ("lightning_runs", "trainer_without_distributed_sampler"),
    "lightning_feedback": ("lightning_runs", "trainer_feedback"),
    "fabric_index": ("lightning_runs", "fabric_index_sampler"),
    "fabric_batch": ("lightning_runs", "fabric_batch_sampler"),
    "fabric_feedback": ("lightning_runs", "fabric_feedback"),
    "accelerate_index": ("accelerate_runs", "index_sampler"),
    "accelerate_batch": ("accelerate_runs", "batch_sampler"),
    "accelerate_feedback": ("accelerate_runs", "feedback"),
    "accelerate_dispatch": ("accelerate_runs", "dispatched"),
    "accelerate_plain_prepare": ("accelerate_runs", "plain_prepare"),
    "stateful_resume": ("torchdata_runs", "resume_with_feedback"),
    "transformers_index": ("transformers_runs", "index_sampler_with_feedback"),
    "transformers_batch": ("transformers_runs", "batch_sampler"),
    **{f"docs_{name}": ("docs_runs", name) for name in DOC_EXAMPLES},
}
#: Scenarios that need ranks of their own, in which nothing has imported ``samplers`` yet.
ALONE = {
    "lightning_lazy_import": ("lazy_import_runs", "batch_sampler_imported_in_the_hook"),
}


def _forget_accelerate() -> None:
    """Drop the process-wide state an Accelerator leaves behind (as Accelerate's own tests do),
    so that the next scenario runs as in a process of its own: a sampler refuses to shard
    itself where Accelerate runs several processes."""
    state = sys.modules.get("accelerate.state")
    if state is not None:
        state.AcceleratorState._reset_state(reset_partial_state=True)


def main(names: list[str]) -> None:
    warnings.filterwarnings("ignore")
    for name in names:
        module, function = {**SCENARIOS, **ALONE}[name]
        started = time.perf_counter()
        run = getattr(importlib.import_module(f"tests.helpers.frameworks.{module}"), function)
        print(f"{module} imported: {time.perf_counter() - started:.1f} s", file=sys.stderr)
        started = time.perf_counter()
        try:
            result = run()
        except Exception:  # reported, and the other scenarios still run
            result = {"crashed": traceback.format_exc()}
        print(f"{name}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
        print("RESULT", name, json.dumps(result), flush=True)
        _forget_accelerate()
        if dist.is_initialized():
            dist.barrier()  # the ranks start each scenario together
    print("DONE", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
