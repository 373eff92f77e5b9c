"""The manual's examples run as written, and its commands compose.

Every ```python block of README.md and docs/**/*.md runs: the three library examples of
docs/samplers.md in their own tests, which check what they print or leave behind, every other
block as it is (docs/trainers.md's run inside the frameworks, in tests/test_frameworks.py).
Every ``python -m runner`` (or ``torchrun ... -m runner``) command in a ```bash block of those
pages composes with Hydra and names only parameters its targets take
(:func:`runner.checks.check_targets`), which is what the app checks before any work; commands
that need files or a cluster are composed only.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
import tomllib
from pathlib import Path

import pytest
import torch

from tests.helpers.processes import check_exit

pytestmark = pytest.mark.unit  # in one process, seconds

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SAMPLERS = ROOT / "docs" / "samplers.md"
# Pages whose python blocks another test runs, and which one.
RUN_ELSEWHERE = {ROOT / "docs" / "trainers.md": "tests/test_frameworks.py"}
# The docs/samplers.md examples with a test of their own, by a string only each one holds.
OWN_TESTS = ("AnnealedSampler(y", "class UsageBalancedSampler", "DistributedDataParallel(")


def fenced_at(text: str, language: str) -> list[tuple[int, str]]:
    """(the line its body starts on, the body) of every fenced block in ``language``."""
    return [
        (text.count("\n", 0, m.start(1)) + 1, m.group(1))
        for m in re.finditer(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)
    ]


def fenced(text: str, language: str) -> list[str]:
    """The bodies of the page's fenced blocks in ``language``."""
    return [body for _, body in fenced_at(text, language)]


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def samplers_example(marker: str) -> str:
    (example,) = [b for b in fenced(SAMPLERS.read_text(), "python") if marker in b]
    return example


# ------------------------------------------------------------------ the samplers library


def test_dataloader_example_runs(capsys):
    exec(compile(samplers_example("AnnealedSampler(y"), "docs/samplers.md", "exec"), {})
    tail_shares = [float(line.split()[1]) for line in capsys.readouterr().out.splitlines()]
    assert len(tail_shares) == 5 and tail_shares[0] > tail_shares[-1]  # class-balanced -> instance


def test_custom_strategy_example_inherits_the_protocol():
    scope: dict = {}
    exec(compile(samplers_example("class UsageBalancedSampler"), "docs/samplers.md", "exec"), scope)
    sampler = scope["UsageBalancedSampler"](
        [0, 0, 0, 1, 1, 2], num_samples=12, seed=0, world_size=2, rank=0
    )
    assert len(sampler) == len(list(sampler)) == 6
    sampler.update(torch.tensor([0, 0, 5]), torch.zeros(3))
    sampler.set_epoch(1)
    assert torch.allclose(
        sampler.current_distribution().weights[[0, 1, 5]],
        torch.tensor([1 / 3, 1.0, 0.5], dtype=torch.float64),
    )


@pytest.mark.ddp
def test_ddp_example_runs_as_two_ranks(tmp_path):
    """Two real processes (gloo), launched with the environment torchrun sets, each on its own so
    that gloo's teardown abort in one cannot take the other down: every rank ends with the same
    feedback state and its own disjoint half of one global draw."""
    import json
    import os
    import socket
    import subprocess
    import sys

    report = (
        "\nimport json\n"
        "print('RESULT', json.dumps({'rank': sampler.rank, 'ema': sampler.loss_ema.sum().item(),"
        " 'seen': int(sampler.seen.sum()), 'indices': sampler.epoch_indices().tolist(),"
        " 'global': sampler.global_indices().tolist()}), flush=True)\n"
    )
    script = tmp_path / "train_ddp.py"
    script.write_text(samplers_example("DistributedDataParallel(") + report)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script)],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={
                **os.environ,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": "2",
                "OMP_NUM_THREADS": "1",
            },
        )
        for rank in range(2)
    ]
    results = []
    for rank in ranks:
        out, err = rank.communicate(timeout=300)
        lines = [
            line.split("RESULT ", 1)[1] for line in out.splitlines() if line.startswith("RESULT ")
        ]
        check_exit(rank.returncode, err, completed=len(lines) == 1)
        results.append(json.loads(lines[0]))
    assert [r["rank"] for r in results] == [0, 1]
    assert (
        results[0]["ema"] == results[1]["ema"] and results[0]["seen"] == results[1]["seen"] > 3000
    )
    assert results[0]["global"] == results[1]["global"]
    assert results[0]["indices"] == results[0]["global"][0::2]
    assert results[1]["indices"] == results[1]["global"][1::2]


# ------------------------------------------------------------------ every other python block


def other_python_blocks() -> list[tuple[str, str]]:
    blocks = []
    for page in PAGES:
        if page in RUN_ELSEWHERE:
            continue
        for number, block in enumerate(fenced(page.read_text(), "python"), start=1):
            if page == SAMPLERS and any(marker in block for marker in OWN_TESTS):
                continue
            blocks.append((f"{relative(page)}:{number}", block))
    return blocks


def test_every_samplers_example_has_its_test():
    """A block added to docs/samplers.md runs below; one of the three tested ones is never lost."""
    blocks = fenced(SAMPLERS.read_text(), "python")
    for marker in OWN_TESTS:
        assert sum(marker in b for b in blocks) == 1, marker


@pytest.mark.parametrize(
    "where, block", other_python_blocks(), ids=[w for w, _ in other_python_blocks()]
)
def test_python_block_runs(where, block, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # whatever it writes lands in the test's folder
    exec(compile(block, where, "exec"), {"__name__": "__main__"})


def shipped_packages() -> set[str]:
    """The top-level packages a wheel holds: pyproject's ``packages.find`` includes."""
    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    return {pattern.rstrip("*") for pattern in found["find"]["include"]}


def checkout_only_modules() -> set[str]:
    """Top-level modules of the checkout that no install has (tests/, scripts/): an example
    importing one works only inside the source tree."""
    names = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    names |= {p.stem for p in ROOT.glob("*.py")}
    return names - shipped_packages()


def test_every_python_example_imports_only_what_an_install_has():
    """Run in process, the examples would find tests/ and scripts/ on the checkout's path:
    their imports are read instead, for every block (those other tests run included)."""
    outside = checkout_only_modules()
    assert {"tests", "scripts"} <= outside
    for page in PAGES:
        for start, block in fenced_at(page.read_text(), "python"):
            for node in ast.walk(ast.parse(block)):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    where = f"{relative(page)}:{start + node.lineno - 1}"
                    assert name.split(".")[0] not in outside, f"{where} imports {name}"


# ------------------------------------------------------------------ every runner command

# Hydra's flags: those that take a value, and the one that makes a sweep.
VALUED_FLAGS = {"--cfg", "-c", "--package", "-p", "--info", "-i", "--config-name", "-cn"}
MULTIRUN_FLAGS = {"-m", "--multirun"}
# Launchers that come from an extra the dev tools leave out: composed where it is installed.
PLUGINS = {"hydra/launcher=ray_cluster": ("hydra_plugins.hydra_ray_launcher", "the ray extra")}


def runner_commands() -> list[tuple[str, list[str]]]:
    """(page:line, the command's words after ``-m runner``) for every runner command in a bash
    block: ``python -m runner``, ``torchrun ... -m runner``, ``samplerlab run``, also behind
    ``/usr/bin/time``;
    continued lines are joined and ``<placeholders>`` become one word."""
    found = []
    for page in PAGES:
        for start, block in fenced_at(page.read_text(), "bash"):
            lines, first = "", 0
            for number, line in enumerate(block.splitlines(), start=start):
                first = first or number
                if line.endswith("\\"):
                    lines += line[:-1] + " "
                    continue
                line, lines, at, first = lines + line, "", first, 0
                words = shlex.split(re.sub(r"<[^<>\n]+>", "PLACEHOLDER", line), comments=True)
                for i in range(1, len(words) - 1):
                    launcher = words[i - 1].endswith(("python", "python3")) or "torchrun" in words
                    if words[i : i + 2] == ["-m", "runner"] and launcher:
                        found.append((f"{relative(page)}:{at}", words[i + 2 :]))
                        break
                    if words[i - 1 : i + 1] == ["samplerlab", "run"]:  # python -m runner's twin
                        found.append((f"{relative(page)}:{at}", words[i + 1 :]))
                        break
    return found


COMMANDS = runner_commands()


def composable(words: list[str]) -> tuple[list[str], bool]:
    """The overrides to compose (a sweep's first value of every swept list) and whether the
    command is a multirun."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides, multirun, skip = [], False, False
    for word in words:
        if skip:
            skip = False
        elif word in MULTIRUN_FLAGS:
            multirun = True
        elif word in VALUED_FLAGS:
            skip = True
        elif not word.startswith("-"):
            overrides.append(word)
    parsed = OverridesParser.create().parse_overrides(overrides)
    first = []
    for text, override in zip(overrides, parsed, strict=True):
        if override.is_sweep_override():
            assert multirun, f"{text} sweeps: the command needs -m"
            text = f"{override.get_key_element()}={next(override.sweep_string_iterator())}"
        first.append(text)
    return first, multirun


def test_the_pages_hold_runner_commands():
    pages = {where.split(":")[0] for where, _ in COMMANDS}
    assert len(COMMANDS) >= 40
    assert {
        "README.md",
        "docs/cli.md",
        "docs/your-data.md",
        "docs/runs.md",
        "docs/studies.md",
        "docs/scaling.md",
        "docs/race.md",
        "docs/your-model.md",
    } <= pages


@pytest.mark.parametrize("where, words", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_runner_command_composes(where, words):
    from runner.checks import check_targets
    from tests.conftest import compose_config

    for needs, (module, extra) in PLUGINS.items():
        if needs in words and importlib.util.find_spec(module) is None:
            pytest.skip(f"{needs} needs {extra} (pip install -e '.[ray]')")
    overrides, _ = composable(words)
    check_targets(compose_config(overrides))
