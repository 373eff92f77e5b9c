"""``samplerlab``: the one command of an installed samplerlab.

``samplerlab run`` is ``python -m runner`` (a run, or a sweep with ``-m``), ``samplerlab advise``
a race over the strategies on the user's data (what ``make advise`` runs), ``samplerlab report``
the comparison report of a sweep, ``samplerlab ui`` MLflow's UI on the local store and
``samplerlab cache`` the caches kept between runs. Each subcommand imports what it needs when it
runs, so that ``samplerlab --help`` answers at once.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from experiments.caches import add_cache_commands
from runner import quick_exit

# make advise's defaults: the strategies raced from scratch, and with a frozen backbone the
# strategies and the decoupled classifiers, each a head on its features.
SAMPLERS = "uniform,weighted,fixed_class,annealed,progressive,deferred,hard_mined,hybrid,mixture"
METHODS = (
    "ce,class_balanced,fixed_class,annealed,progressive,drs,hard_mined,hybrid,mixture,"
    "crt,tau_norm,posthoc_la,logistic_la,logistic_balanced,lws,ncm"
)
TENSOR_FILES = (".npz", ".pt")
# What Hydra reads unquoted in an override's value; anything else in a path is quoted.
PLAIN = re.compile(r"[\w/.\-+:@~%]+")

ADVISE_HELP = "which sampler for your data: a race on a validation split"
RUN_HELP = """\
usage: samplerlab run [-m] [GROUP=OPTION ...] [KEY=VALUE ...]

One run (or, with -m, a sweep: sampler=a,b seed=0,1), exactly as python -m runner: every
argument is a Hydra override, e.g. samplerlab run sampler=annealed trainer.epochs=1.
Its config groups and options follow.
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the subcommand ``argv`` names (default: this process's arguments); its exit status."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["run"]:  # Hydra parses its own arguments (-m, --cfg, overrides)
        return run(arguments[1:])
    if arguments[:1] == ["advise"]:  # DATA, options and overrides in any order
        return advise_command(advise_parser().parse_intermixed_args(arguments[1:]))
    if arguments[:1] == ["report"]:  # so does the report
        from experiments.report.cli import main as report

        return report(arguments[1:])
    args = parser().parse_args(arguments)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="samplerlab",
        description="samplerlab: samplers for long-tailed classification, compared in MLflow. "
        "Each command has its --help.",
    )
    commands = top.add_subparsers(title="commands", metavar="COMMAND", required=True)
    commands.add_parser("run", help="a run or, with -m, a sweep (Hydra overrides; see run --help)")
    commands.add_parser("advise", help=ADVISE_HELP + " (see advise --help)")
    commands.add_parser("report", help="a sweep's comparison report (see report --help)")
    ui = commands.add_parser("ui", help="MLflow's UI on the local store")
    ui.add_argument("--port", type=int, default=5000)
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument("--uri", help="the store (default: where runs write, as for runs)")
    ui.set_defaults(handler=ui_command)
    add_cache_commands(commands)
    return top


def advise_parser() -> argparse.ArgumentParser:
    """``samplerlab advise``'s arguments; parsed intermixed: DATA, options and overrides in any
    order."""
    advise = argparse.ArgumentParser(
        prog="samplerlab advise",
        description="A race of the strategies (with --model: and the decoupled classifiers) on "
        "a validation split of DATA; the answer is on the sweep's parent run in MLflow. The same "
        "as: samplerlab run -m hydra/sweeper=race data=... (printed before it starts).",
    )
    advise.add_argument(
        "data",
        nargs="?",
        default="digits",
        metavar="DATA",
        help="a .npz or .pt tensor file, a folder of class folders (its test set is 20%% of "
        "every class), or digits (the default: the advise_digits demo study)",
    )
    advise.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="more Hydra overrides")
    advise.add_argument(
        "--model",
        help="timm:NAME: that backbone, frozen, its features computed once; the race is then "
        "over the strategies and the decoupled classifiers (--methods)",
    )
    advise.add_argument("--weights", help="the backbone's weights, a state dict or .safetensors")
    advise.add_argument("--samplers", default=SAMPLERS, help="raced without --model")
    advise.add_argument("--methods", default=METHODS, help="raced with --model")
    advise.add_argument("--val", type=int, default=20, help="validation images per class")
    advise.add_argument("--budget", type=int, help="at most this many runs")
    advise.add_argument("--size", type=int, help="a folder of images: their size in pixels")
    return advise


def run(overrides: list[str]) -> int:
    """``python -m runner *overrides`` in this process (Hydra reads ``sys.argv``). Called from
    code rather than by the ``samplerlab`` program, it leaves the process's end to its caller
    (:mod:`runner.quick_exit`)."""
    import runpy

    if overrides in (["-h"], ["--help"]):
        print(RUN_HELP)
    sys.argv = ["samplerlab run", *overrides]
    called = not quick_exit.armed()
    try:
        runpy.run_module("runner", run_name="__main__", alter_sys=True)
    finally:
        if called:
            quick_exit.forget()
    return 0


def advise_overrides(args: argparse.Namespace) -> list[str]:
    """The race's command line (after ``python -m runner``) for ``samplerlab advise``'s
    arguments; raises :class:`ValueError` with the one line a user needs for a wrong one."""
    data = args.data
    if "=" in data:
        raise ValueError(f"DATA={data}: give DATA before any override (digits for the demo)")
    budget = [f"hydra.sweeper.max_runs={args.budget}"] if args.budget is not None else []
    race = ["-m", "hydra/sweeper=race"]
    if data == "digits":
        for option in ("model", "weights", "size"):
            if getattr(args, option) is not None:
                raise ValueError(f"--{option}: needs DATA (a .npz/.pt file or a folder)")
        return [*race, "+experiment=advise_digits", *budget, *args.overrides]
    path = Path(data).expanduser().absolute()
    if not path.exists():
        raise ValueError(f"DATA={data}: no such file or folder; give a .npz/.pt file or a folder")
    model = _frozen_backbone(args)
    if path.suffix in TENSOR_FILES and path.is_file():
        if args.size is not None:
            raise ValueError("--size: only for a folder of images; a tensor file has its size")
        source = ["data=tensor_file", f"data.path={hydra_value(path)}", *model]
    else:
        size = [f"data.image_size={args.size}"] if args.size is not None else []
        images = model or ["model=small_cnn"]
        source = ["data=torchvision", f"data.dataset.root={hydra_value(path)}", *images, *size]
    candidates = f"+method={args.methods}" if args.model else f"sampler={args.samplers}"
    split = [f"data.val_per_class={args.val}", "tracking.experiment=advise"]
    return [*race, *source, *split, candidates, *budget, *args.overrides]


def _frozen_backbone(args: argparse.Namespace) -> list[str]:
    """The overrides of ``--model timm:NAME`` (with ``--weights``): that backbone, frozen."""
    if args.model is None:
        if args.weights is not None:
            raise ValueError("--weights: needs --model timm:NAME, the backbone they belong to")
        return []
    name = args.model.removeprefix("timm:")
    weights = Path(args.weights).expanduser().absolute() if args.weights else None
    return [
        "model=timm",
        f"model.name={hydra_value(name)}",
        *([f"model.weights={hydra_value(weights)}"] if weights is not None else []),
        "model.freeze=true",
        "trainer.augment=false",
    ]


def hydra_value(value: object) -> str:
    """``value`` as a Hydra override's value that reads back as the same string: as it is when
    plain, else quoted (a path with spaces, commas or brackets)."""
    text = str(value)
    if PLAIN.fullmatch(text):
        return text
    for quote in ("'", '"'):
        if quote not in text and not text.endswith("\\"):
            return f"{quote}{text}{quote}"
    raise ValueError(f"{text}: a path with both kinds of quotes; rename it")


def advise_command(args: argparse.Namespace) -> int:
    try:
        overrides = advise_overrides(args)
    except ValueError as error:
        print(f"samplerlab advise: {error}", file=sys.stderr)
        return 2
    print("samplerlab run " + " ".join(overrides), flush=True)
    return run(overrides)


def ui_arguments(args: argparse.Namespace) -> list[str]:
    """The arguments of ``python`` that serve MLflow's UI for ``samplerlab ui``'s: the store
    runs write to by default (:func:`runner.tracking.stores.resolve_uri`) unless ``--uri``;
    :class:`ValueError` for a tracking server, which has a UI of its own."""
    from runner.tracking.stores import resolve_uri

    uri = resolve_uri(args.uri)
    if not uri.startswith("sqlite:") and "://" in uri:
        raise ValueError(
            f"{uri} is a tracking server, which serves its own UI: open it in a browser "
            "(or give --uri sqlite:///<file>)"
        )
    store = ["--backend-store-uri", uri, "--host", args.host, "--port", str(args.port)]
    return ["-m", "mlflow", "ui", *store]


def ui_command(args: argparse.Namespace) -> int:
    try:
        arguments = ui_arguments(args)
    except ValueError as error:
        print(f"samplerlab ui: {error}", file=sys.stderr)
        return 2
    os.execv(sys.executable, [sys.executable, *arguments])


def program() -> None:
    """The ``samplerlab`` program (its console script): :func:`main`, after which the process
    ends as ``python -m runner``'s does, without the interpreter's teardown
    (:mod:`runner.quick_exit`)."""
    with quick_exit.command():
        sys.exit(main())


if __name__ == "__main__":
    program()
