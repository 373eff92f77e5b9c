"""The ``samplerlab`` command (experiments/command.py): its help, the race ``advise`` builds (the
same overrides ``make advise`` built, composed with the real config tree), the caches it lists
and clears, and a real ``samplerlab run`` that writes nothing into the checkout."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from experiments.command import (
    METHODS,
    SAMPLERS,
    advise_overrides,
    advise_parser,
    hydra_value,
    main,
    ui_arguments,
)
from runner import cache_dirs
from runner.config import CONF
from runner.errors import UserError
from runner.locks import turn
from tests.helpers.cli import run_python

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).parent / "samplerlab"  # what pip installs for [project.scripts]
# Where a run would write into the checkout if it kept its files beside the code.
CHECKOUT_PLACES = (".cache", "outputs", "multirun", "mlruns", "mlartifacts", "mlflow.db")


def advise(*argv: str) -> list[str]:
    """``samplerlab advise *argv``'s overrides, parsed by the real parser."""
    return advise_overrides(advise_parser().parse_intermixed_args(argv))


@pytest.mark.unit
@pytest.mark.parametrize(
    "command", [[], ["advise"], ["ui"], ["cache"], ["cache", "list"], ["cache", "clear"]]
)
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: samplerlab {' '.join(command)}".rstrip())


@pytest.mark.slow
def test_the_installed_script_answers_help_at_once_and_run_help_lists_the_config(tmp_path):
    """The console script pip installs (``make install``); ``run --help`` and ``report --help``
    are Hydra's and the report's own help, behind the command's."""
    assert SCRIPT.is_file(), "samplerlab is not installed: pip install -e . (make install)"
    top = subprocess.run([SCRIPT, "--help"], capture_output=True, text=True, timeout=60, check=True)
    for name in ("run", "advise", "report", "ui", "cache"):
        assert f"\n    {name} " in top.stdout
    ran = run_python("-m", "experiments.command", "run", "--help", cwd=tmp_path)
    assert ran.stdout.startswith("usage: samplerlab run [-m]") and "sampler: annealed" in ran.stdout
    report = run_python("-m", "experiments.command", "report", "--help", cwd=tmp_path)
    assert "--parent" in report.stdout


@pytest.mark.unit
def test_advise_builds_the_race_make_advise_built(tmp_path):
    """The overrides of make advise's ADVISE_* variables, for each kind of DATA."""
    npz, folder, weights = tmp_path / "f.npz", tmp_path / "images", tmp_path / "w.pt"
    npz.touch(), folder.mkdir(), weights.touch()
    race = ["-m", "hydra/sweeper=race"]
    split = ["data.val_per_class=20", "tracking.experiment=advise"]
    assert advise() == [*race, "+experiment=advise_digits"]
    assert advise("digits", "--budget", "30", "trainer.epochs=2") == [
        *race,
        "+experiment=advise_digits",
        "hydra.sweeper.max_runs=30",
        "trainer.epochs=2",
    ]
    assert advise(str(npz)) == [
        *race,
        "data=tensor_file",
        f"data.path={npz}",
        *split,
        f"sampler={SAMPLERS}",
    ]
    frozen = ["model=timm", "model.name=resnet18", f"model.weights={weights}"]
    frozen += ["model.freeze=true", "trainer.augment=false"]
    assert advise(str(npz), "--model", "timm:resnet18", "--weights", str(weights)) == [
        *race,
        "data=tensor_file",
        f"data.path={npz}",
        *frozen,
        *split,
        f"+method={METHODS}",
    ]
    assert advise(str(folder), "--val", "5", "--size", "64", "--samplers", "uniform,weighted") == [
        *race,
        "data=torchvision",
        f"data.dataset.root={folder}",
        "model=small_cnn",
        "data.image_size=64",
        "data.val_per_class=5",
        "tracking.experiment=advise",
        "sampler=uniform,weighted",
    ]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["nowhere.npz"], "DATA=nowhere.npz: no such file or folder"),
        (["trainer.epochs=1"], "give DATA before any override"),
        (["digits", "--model", "timm:resnet18"], "--model: needs DATA"),
        (["{npz}", "--size", "64"], "--size: only for a folder of images"),
        (["{npz}", "--weights", "{npz}"], "--weights: needs --model"),
    ],
)
def test_advise_refuses_what_it_cannot_race_in_one_line(argv, message, tmp_path, capsys):
    npz = tmp_path / "f.npz"
    npz.touch()
    status = main(["advise", *(a.format(npz=npz) for a in argv)])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("samplerlab advise: ") and message in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.unit
def test_the_race_advise_builds_composes_and_passes_the_race_checks(tmp_path):
    """advise's overrides against the real config tree: Hydra composes the multirun and the
    race sweeper's own checks accept the first job's config (nothing is launched)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from hydra_plugins.samplerlab_race.race_sweeper import RaceSweeper

    data = tmp_path / "my data, v2.npz"  # a path Hydra reads only quoted
    x, y = np.random.default_rng(0).normal(size=(60, 4)), np.repeat([0, 1, 2], [30, 20, 10])
    np.savez(data, x=x.astype(np.float32), y=y)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        overrides = advise(str(data), "--val", "4", "--budget", "30")[1:]  # less -m
        config = loader.load_configuration("config", overrides, run_mode=RunMode.MULTIRUN)
    assert config.data.path == str(data) and config.hydra.sweeper.max_runs == 30
    RaceSweeper.check(config)
    GlobalHydra.instance().clear()


@pytest.mark.unit
@pytest.mark.parametrize(
    "path", ["/a/b.npz", "/my data/x.pt", "/a,b/[c]/d=e.npz", "/it's/x.npz", '/say "hi"/x']
)
def test_a_path_reads_back_from_hydra_as_itself(path):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_override(f"data.path={hydra_value(path)}")
    assert parsed.value() == path


@pytest.mark.unit
def test_ui_serves_the_store_runs_write_to(monkeypatch):
    from runner.tracking.stores import resolve_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    args = argparse.Namespace(uri=None, host="127.0.0.1", port=5001)
    store = resolve_uri(None)
    assert ui_arguments(args) == [
        *["-m", "mlflow", "ui", "--backend-store-uri", store],
        *["--host", "127.0.0.1", "--port", "5001"],
    ]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    with pytest.raises(ValueError, match="a tracking server, which serves its own UI"):
        ui_arguments(args)


@pytest.mark.slow
def test_cache_list_shows_each_cache_and_clear_removes_them(user_cache, tmp_path):
    """The installed script, with SAMPLERLAB_CACHE set (by conftest's user_cache)."""
    features = user_cache / "features"
    features.mkdir()
    (features / "digits-train-abc.pt").write_bytes(b"x" * 1500)
    listed = subprocess.run(
        [SCRIPT, "cache", "list"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert listed.splitlines()[0] == f"samplerlab caches in {user_cache}"
    rows = [line.split() for line in listed.splitlines()]
    assert ["features", "1.5", "KB", "1", "files", str(features)] in rows
    assert ["prefixes", "0", "B", "0", "files", str(user_cache / "prefixes")] in rows
    cleared = subprocess.run(
        [SCRIPT, "cache", "clear", "features"], capture_output=True, text=True, timeout=60
    )
    assert cleared.returncode == 0 and not features.exists()


@pytest.mark.unit
def test_cache_clear_leaves_a_cache_a_job_is_using(user_cache, capsys):
    lock = cache_dirs.folder("prefixes") / "sweep" / "family" / "seed-0" / "lock"
    inside, leave = threading.Event(), threading.Event()

    def job() -> None:
        with turn(lock, 60, "prefixes.cache_dir", "x", print):
            inside.set()
            leave.wait(10)

    holder = threading.Thread(target=job)
    holder.start()
    assert inside.wait(10)
    assert main(["cache", "clear"]) == 1
    assert f"a job is using {lock}" in capsys.readouterr().err and lock.exists()
    leave.set()
    holder.join(10)
    assert main(["cache", "clear"]) == 0 and not cache_dirs.folder("prefixes").exists()


@pytest.mark.unit
def test_the_cache_root_is_the_users_never_the_package(monkeypatch):
    monkeypatch.delenv(cache_dirs.ENV)
    home = cache_dirs.root()
    assert home.name == "samplerlab" and ROOT not in home.parents
    assert Path(cache_dirs.__file__).parents[1] not in home.parents
    monkeypatch.setenv(cache_dirs.ENV, "~/elsewhere")
    assert cache_dirs.folder("features") == Path.home() / "elsewhere" / "features"
    with pytest.raises(KeyError, match="the caches: features, prefixes, images"):
        cache_dirs.folder("data")


@pytest.mark.slow
def test_samplerlab_run_writes_nothing_into_the_checkout(tmp_path, tracking_uri, user_cache):
    """``samplerlab run trainer.epochs=1`` from an empty folder: its outputs there and in the
    store, its caches in SAMPLERLAB_CACHE, nothing under the checkout."""
    before = {place: _stamp(ROOT / place) for place in CHECKOUT_PLACES}
    work = tmp_path / "empty"
    work.mkdir()
    done = run_python(
        "-m",
        "experiments.command",
        "run",
        "trainer.epochs=1",
        "tracking.plots=false",
        f"tracking.uri={tracking_uri}",
        cwd=work,
    )
    assert "final" in done.stdout and (work / "outputs").is_dir()
    assert {place: _stamp(ROOT / place) for place in CHECKOUT_PLACES} == before


def _stamp(path: Path) -> tuple[float, int] | None:
    """When ``path`` last changed and how many entries it has; None when it does not exist."""
    if not path.exists():
        return None
    return path.stat().st_mtime, len(os.listdir(path)) if path.is_dir() else 0


@pytest.mark.unit
def test_a_missing_launcher_plugin_names_its_extra(monkeypatch):
    from runner import extras

    assert extras.installed("torch") and not extras.installed("no_such_package.sub")
    extras.check_launcher(["hydra/launcher=joblib"])  # installed here (the dev extra)
    monkeypatch.setattr(
        extras, "installed", lambda module: module != "hydra_plugins.hydra_joblib_launcher"
    )
    extras.check_launcher(["hydra/launcher=submitit_local", "sampler=a,b"])
    with pytest.raises(UserError) as refused:
        extras.check_launcher(["-m", "hydra/launcher=joblib"])
    assert str(refused.value) == (
        "hydra/launcher=joblib: needs hydra_joblib_launcher, which is not installed\n"
        "pip install 'samplerlab[joblib]'"
    )
