"""Bad inputs answer in one or two lines before any training, against a real sqlite store:
every kind of mistake through the real CLI (in this process: the same parsing, checks, run and
error printing); a bug keeps its traceback."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from PIL import Image

from tests.helpers.bad_files import bad_file_cases
from tests.helpers.cli import run_cli

pytestmark = pytest.mark.slow  # the CLI end to end, training

# Every case: one short epoch, nothing slow recorded.
SHORT = ["trainer.epochs=1", "trainer.progress=false", "tracking.log_model=false"]


def _write_images(root: Path, layout: dict[str, dict[str, int]], size: int = 8) -> Path:
    """``{split: {class: images}}`` as PNG files."""
    for split, classes in layout.items():
        for c, (name, count) in enumerate(classes.items()):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                Image.fromarray(np.full((size, size, 3), (17 * c + i) % 256, np.uint8)).save(
                    folder / f"{i:03d}.png"
                )
    return root


# The cases in three shares, each against a store of its own: the shares run in parallel on
# the suite's workers (together they take minutes); every case is in exactly one.
SHARES = 3
# The cases whose run starts and then diverges, by an override of theirs: their runs end FAILED
# (in training: a huge trainer.lr, LDAM on a linear head; in cRT's classifier stage).
DIVERGING = ("trainer.lr=1e6", "loss=ldam", "trainer.classifier_lr=1e30")


def diverges(args: list[str]) -> bool:
    return any(arg in DIVERGING for arg in args)


@pytest.fixture(scope="module", params=range(SHARES), ids=lambda share: f"share{share}")
def bad_inputs(request, tmp_path_factory, migrated_store):
    """Every case of one share run once against one store, through the CLI (in this
    process)."""
    tmp = tmp_path_factory.mktemp("bad")
    db = tmp / "mlflow.db"
    shutil.copy(migrated_store, db)
    uri = f"sqlite:///{db}"
    client = MlflowClient(uri)
    client.delete_experiment(client.create_experiment("gone"))
    artifacts = (tmp / "mlartifacts").as_uri()
    earlier = client.create_run(client.create_experiment("samplerlab", artifacts)).info.run_id
    client.log_metric(earlier, "kept", 1.0)
    client.set_terminated(earlier, "KILLED")  # recorded before: must stay exactly as it is
    good = {"train": {"a": 6, "b": 6}, "test": {"a": 2, "b": 2}}
    disjoint = _write_images(
        tmp / "disjoint", {"train": {"a": 6, "c": 6}, "test": {"b": 2, "c": 2}}
    )
    corrupt = _write_images(tmp / "corrupt", good)
    (corrupt / "train" / "a" / "000.png").write_bytes(b"not a png")
    mixed = _write_images(tmp / "mixed", good)
    Image.fromarray(np.zeros((9, 9, 3), np.uint8)).save(mixed / "test" / "b" / "001.png")
    image = ["data=image_folder_lt", "model=small_cnn", f"data.cache_dir={tmp / 'cache'}"]
    files = bad_file_cases(tmp)
    cases = [
        # composition: Hydra's own checks
        (["trainer.epoch=3"], "trainer.epoch"),
        (["trainer.epochs=three"], "trainer.epochs"),
        (["trainer.batch_size=1.5"], "trainer.batch_size"),
        (["sampler=annealing"], "sampler/annealing"),
        (["tracking.plot=false"], "tracking.plot"),
        # one of each kind of value
        (["+sampler.sedd=1"], "sampler.sedd"),
        (["trainer.schedule=exp"], "trainer.schedule"),
        (["trainer.epochs=0"], "trainer.epochs"),
        (["sampler=annealed", "sampler.schedule=bogus"], "schedule"),
        (["data.imbalance_factor=0.5"], "data.imbalance_factor"),
        ([*image, f"data.root={corrupt}", "data.imbalance_factor=2"], "000.png"),
        (["loss=focal", "loss.gamma=-1"], "loss.gamma"),
        # non-finite samples, every split (tensor files) and a synthetic source
        *files[:4],
        (["data.noise=inf"], "data.noise"),
        (  # the YAML sets the other two: the message says how to unset them
            ["sampler=fixed_class", "+sampler.quotas=[13,13,13,13,13,13,13,13,13,11]"],
            "sampler.classes_per_batch=null sampler.samples_per_class=null",
        ),
        # divergence: a FAILED run, never FINISHED
        (["trainer.lr=1e6", "trainer.warmup_epochs=0"], "trainer.lr"),
        (["trainer.classifier_epochs=1", "trainer.classifier_lr=1e30"], "trainer.classifier_lr"),
        (["loss=ldam", "trainer.epochs=3"], "model.head=cosine"),
        # stores
        (["tracking.uri=http://127.0.0.1:9"], "tracking.uri"),
        (["tracking.uri=sqlite:////proc/x.db"], "tracking.uri"),
        (["tracking.uri=sqlite:////nonexistent/folder/x.db"], "tracking.uri"),
        (["tracking.uri=postgresql+psycopg://u@127.0.0.1:1/db"], "tracking.uri"),  # nobody there
        (["tracking.uri=mysql://u@127.0.0.1:1/db"], "its database driver"),
        (["tracking.retries=-1"], "tracking.retries"),
        (["tracking.experiment="], "tracking.experiment"),
        (["tracking.experiment=gone"], "tracking.experiment"),
        (["resume=0123456789abcdef"], "resume"),
        # targets' parameters
        (["+sampler.labels=[0]"], "sampler.labels"),
        (["+data.colour=red"], "data.colour"),
        (["+loss.alpha=1"], "loss.alpha"),
        # trainer values
        (["trainer.warmup_epochs=50"], "trainer.warmup_epochs"),
        (["trainer.device=tpu"], "trainer.device"),
        (["trainer.lr=0"], "trainer.lr"),
        (["trainer.lr=nan"], "trainer.lr"),
        (["trainer.lr=inf"], "trainer.lr"),
        (["trainer.momentum=1.5"], "trainer.momentum"),
        (["trainer.weight_decay=-1"], "trainer.weight_decay"),
        (["trainer.checkpoint_every=-1"], "trainer.checkpoint_every"),
        (["trainer.gamma=0"], "trainer.gamma"),
        (["eval.few_shot=500"], "eval.few_shot"),
        (["sampler=annealed", "sampler.total_epochs=0"], "total_epochs"),
        (
            ["sampler=weighted", "sampler.replacement=false", "sampler.num_samples=999999"],
            "num_samples",
        ),
        (["sampler=fixed_class", "trainer.batch_size=100"], "batch_size"),
        (["sampler=hard_mined", "sampler.floor=0"], "floor"),
        # data
        (["data.n_max=50", "data.imbalance_factor=100"], "data.n_max"),
        (["data.num_classes=1"], "num_classes"),
        (["data=cifar10_lt", "data.root=/nonexistent"], "data.root"),
        (["data=cifar100_lt", "data.variant=cifar20"], "data.variant"),
        (["data=image_folder_lt"], "data.root"),
        ([*image, "data.root=/nonexistent"], "data.root"),
        ([*image, f"data.root={disjoint}"], "['b']"),
        ([*image, f"data.root={mixed}", "data.imbalance_factor=2"], "001.png"),
        # the user's own files (tests/helpers/bad_files.py)
        *files[4:],
        # losses and models
        (["loss.weights=sampler"], "loss.weights"),
        (["loss=cb_ce", "loss.beta=1.5"], "loss.beta"),
        (["model=small_cnn"], "model=mlp"),
    ]

    def attempt(
        case: tuple[list[str], str],
    ) -> tuple[list[str], str, subprocess.CompletedProcess, float]:
        args, _ = case
        own_store = any(a.startswith("tracking.uri=") for a in args)
        started = time.perf_counter()
        # Any exit status: the test reports every case that is not a user error's exit 2.
        done = run_cli(
            *SHORT, *args, cwd=tmp, uri=None if own_store else uri, timeout=120, expect=None
        )
        return (*case, done, time.perf_counter() - started)

    assert len(cases) >= 60 and sum(diverges(args) for args, _ in cases) == len(DIVERGING)
    share = cases[request.param :: SHARES]
    return [attempt(case) for case in share], uri, earlier


def test_every_bad_input_gets_one_or_two_lines_and_exit_2(bad_inputs):
    results, uri, earlier = bad_inputs
    assert len(results) >= 20
    problems = []
    # A store check must answer in seconds, not retry for minutes (MLflow's database retries
    # take ~100 s): no slower than the slowest plain config error, give or take half a minute
    # (the cases share two cores with the rest of the suite).
    plain = max(seconds for args, _, _, seconds in results if args[0].startswith("trainer."))
    for args, parameter, done, seconds in results:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        if done.returncode != 2 or len(lines) > 3 or parameter not in done.stderr:
            problems.append(f"{' '.join(args)}: rc={done.returncode} stderr={done.stderr[-800:]!r}")
        elif "Traceback" in done.stderr:
            problems.append(f"{' '.join(args)}: traceback")
        elif args[0].startswith("tracking.uri=") and seconds > plain + 30:
            problems.append(f"{' '.join(args)}: took {seconds:.0f} s (config errors {plain:.0f} s)")
    assert not problems, "\n".join(problems)
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    before = client.get_run(earlier)
    assert before.info.status == "KILLED" and before.data.metrics == {"kept": 1.0}
    runs = [r for r in runs if r.info.run_id != earlier]
    assert {r.info.status for r in runs} <= {"FAILED"}  # never RUNNING, never FINISHED
    assert len(runs) == sum(diverges(args) for args, _, _, _ in results)
    for diverged in runs:
        assert diverged.data.tags["sampler"] == "uniform"
        assert "train/loss" not in diverged.data.metrics or np.isfinite(
            diverged.data.metrics["train/loss"]
        )


def test_a_bug_still_shows_its_traceback(tmp_path, tracking_uri):
    # A negative layer width passes the config checks, then breaks inside torch.
    done = run_cli(
        "model=mlp",
        "data=digits_lt",
        "model.hidden=[-1]",
        cwd=tmp_path,
        uri=tracking_uri,
        timeout=120,
        expect=1,
    )
    assert "Traceback" in done.stderr, done.stderr[-3000:]


@pytest.mark.unit
def test_the_runners_exceptions_cross_process_boundaries():
    """joblib's and submitit's workers return a job's exception to the sweep pickled: one that
    does not unpickle becomes loky's "BrokenProcessPool" instead of its own message."""
    import pickle
    import signal

    from runner.errors import UserError
    from runner.signals import Interrupted
    from runner.tracking import StoreLost
    from runner.train.fit import Diverged

    lost = StoreLost.during(
        "http://127.0.0.1:9", "logging metrics", OSError("refused"), [("a", 1.0, 2, 3)]
    )
    for error in (
        UserError("trainer.lr=-1: must be > 0"),
        lost,
        Diverged(2, 5, 0.75),
        Interrupted(signal.SIGTERM, safe=True),
    ):
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error)
        assert vars(back) == vars(error)
    assert pickle.loads(pickle.dumps(lost)).exit_code == 75
