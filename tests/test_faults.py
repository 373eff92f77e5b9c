"""Faults during a run, through the real CLI: a tracking server lost mid-run, stores that are not
MLflow's (a checkpoint that cannot be read or written: tests/test_faults_checkpoints.py; a sweep
stopped while its jobs run in other processes: tests/test_faults_sweeps.py). Each asserts the exit code, at most three lines,
no traceback, and the store and files before and after."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from runner.tracking.server import QUIET_SERVER, free_port, wait_until_healthy
from tests.helpers.cli import environment, run_cli, run_python, start_cli, wait_for
from tests.test_resume import history

pytestmark = pytest.mark.slow  # the CLI end to end, training, signals

QUICK = [
    "trainer.progress=false",
    "tracking.plots=false",
    "tracking.log_model=false",
    "trainer.threads=1",
]


def said(stderr: str) -> list[str]:
    """The lines samplerlab printed to stderr (MLflow's own INFO lines left out)."""
    return [line for line in stderr.splitlines() if line.strip() and " INFO " not in line]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- a tracking server lost mid-run ------------------------------------------------------


def _server(port: int, folder: Path) -> subprocess.Popen:
    """A real `mlflow server` on loopback over a sqlite store in ``folder``."""
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{folder / 'server.db'}",
            "--artifacts-destination",
            (folder / "artifacts").as_uri(),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=environment(QUIET_SERVER),  # no job-queue consumers: a server, not ten processes
        start_new_session=True,  # its workers with it, to stop them all at once
    )
    wait_until_healthy(f"http://127.0.0.1:{port}", server)
    return server


def _kill(server: subprocess.Popen) -> None:
    os.killpg(server.pid, signal.SIGKILL)
    server.wait()


LOST = [
    "data=digits_lt",
    "model=small_cnn",
    "model.width=8",
    "trainer.batch_size=16",
    "trainer.epochs=8",
    "tracking.retries=1",
    "tracking.request_timeout=2",
    *QUICK,
]


def test_a_lost_server_stops_the_run_in_seconds_and_resume_loses_no_step(tmp_path):
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = _server(port, tmp_path)
    log = tmp_path / "run.log"
    try:
        process = start_cli(*LOST, cwd=tmp_path, log=log, uri=uri)
        wait_for(log, "epoch 3/8", process)
    finally:
        _kill(server)
    lost_at = time.monotonic()
    assert process.wait(timeout=120) == 75, log.read_text()[-3000:]
    seconds = time.monotonic() - lost_at
    lines = said(log.read_text().split("epoch 3/8", 1)[1])
    stop = [line for line in lines if line.startswith("samplerlab:")]
    assert seconds < 60 and "Traceback" not in log.read_text(), log.read_text()[-3000:]
    assert len(stop) == 1 and "tracking.uri" in stop[0], lines
    (command,) = [line for line in lines if "continue it with: " in line]
    checkpoint = Path(command.split("checkpointed to ", 1)[1].split(";", 1)[0])
    assert checkpoint.is_file()
    again = command.split("continue it with: ", 1)[1].split()
    assert again[:3] == ["python", "-m", "runner"] and f"tracking.uri={uri}" in again

    server = _server(port, tmp_path)  # the server is back, with its store
    try:
        run_cli(*again[3:], "trainer.progress=false", cwd=tmp_path)
        client = MlflowClient(uri)
        (run,) = client.search_runs([client.get_experiment_by_name("samplerlab").experiment_id])
        assert run.info.status == "FINISHED"
        steps = {k: [s for s, _ in v] for k, v in history(client, run.info.run_id).items()}
    finally:
        _kill(server)
    assert steps["train/loss"] == list(range(1, 9))  # no epoch lost, none logged twice
    assert steps["test/balanced_accuracy"] == list(range(1, 9))
    assert steps["final/balanced_accuracy"] == [8]


# --- stores that are not ours --------------------------------------------------------------


def _database(path: Path, *statements: str) -> Path:
    """An sqlite file at ``path`` made by ``statements``, committed and closed."""
    import sqlite3

    connection = sqlite3.connect(path)
    for statement in statements:
        connection.execute(statement)
    connection.commit()
    connection.close()
    return path


def _foreign(folder: Path) -> dict[str, Path]:
    app = _database(
        folder / "app.db",
        "CREATE TABLE users (id INTEGER, name TEXT)",
        "INSERT INTO users VALUES (1, 'ada')",
    )
    logged = _database(  # write-ahead logging: a read must not create its -shm file
        folder / "logged.db", "PRAGMA journal_mode=WAL", "CREATE TABLE events (id INTEGER)"
    )
    noise = folder / "noise.db"
    noise.write_bytes(bytes(range(256)) * 20)
    return {"app": app, "logged": logged, "noise": noise}


@pytest.mark.parametrize("kind", ["app", "logged", "noise"])
@pytest.mark.parametrize(
    "command",
    [
        ["-m", "runner", "trainer.epochs=1", "tracking.uri=sqlite:///{path}"],
        ["-m", "experiments.report", "--uri", "sqlite:///{path}"],
    ],
    ids=["runner", "report"],
)
def test_a_file_that_is_not_an_mlflow_store_is_refused_and_left_unchanged(kind, command, tmp_path):
    path = _foreign(tmp_path)[kind]
    before = digest(path)
    done = run_python(
        *[part.format(path=path) for part in command], cwd=tmp_path, timeout=120, expect=2
    )
    lines = said(done.stderr)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert len(lines) <= 3 and ("tracking.uri" in lines[0] or "--uri" in lines[0]), lines
    assert digest(path) == before
    databases = sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".db")
    assert databases == ["app.db", "logged.db", "noise.db"]
    assert not list(tmp_path.glob("*.db-*"))  # no journal or WAL file left beside it


def test_the_report_reads_an_mlflow_store_without_changing_it(tmp_path, tracking_uri):
    path = Path(tracking_uri.removeprefix("sqlite:///"))
    run_cli("trainer.epochs=1", *QUICK, cwd=tmp_path, uri=tracking_uri, timeout=120)
    before = digest(path)
    done = run_python(
        "-m", "experiments.report", "--uri", tracking_uri, "--no-log", cwd=tmp_path, timeout=120
    )
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert digest(path) == before
    empty = tmp_path / "empty.db"
    empty.touch()
    refused = run_python(
        "-m",
        "experiments.report",
        "--uri",
        f"sqlite:///{empty}",
        cwd=tmp_path,
        timeout=120,
        expect=2,
    )
    assert empty.stat().st_size == 0, refused.stderr


# Commits of a few hundred kB in a loop, into tables created and emptied as it goes.
WRITER = """
import os, sqlite3, sys
connection = sqlite3.connect(sys.argv[1], timeout=30)
for i in range(10**9):
    table = f"t{i % 20}"
    connection.execute(f"CREATE TABLE IF NOT EXISTS {table} (a, b)")
    connection.executemany(f"INSERT INTO {table} VALUES (?, ?)", [(j, os.urandom(100)) for j in range(2000)])
    if i % 7 == 6:
        connection.execute(f"DELETE FROM {table}")
    connection.commit()
"""


def test_a_store_that_another_process_writes_is_read_whole(tmp_path):
    # A sweep's jobs check the store while other jobs log into it. A read that does not wait
    # for the writer's lock can meet a page half-written ("database disk image is malformed"),
    # and the job would stop as if the store were not MLflow's.
    from runner.tracking.stores import MLFLOW_TABLES, sqlite_tables

    path = _database(
        tmp_path / "busy.db",
        "CREATE TABLE experiments (id INTEGER)",
        "CREATE TABLE alembic_version (version_num TEXT)",
    )
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)])
    try:
        deadline = time.monotonic() + 30
        while path.stat().st_size < 10**6:  # the writer's first commits
            assert writer.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        for _ in range(500):
            tables = sqlite_tables(path)
            assert tables is not None and tables >= MLFLOW_TABLES
        assert writer.poll() is None  # it wrote all along
    finally:
        writer.kill()
        writer.wait()


# A write transaction that spills its pages into the file, then waits to be killed.
STOPPED_MID_WRITE = """
import os, sqlite3, sys, time
connection = sqlite3.connect(sys.argv[1])
connection.execute("PRAGMA cache_size=1")
connection.execute("BEGIN")
connection.executemany("INSERT INTO runs VALUES (?)", [(os.urandom(200),) for _ in range(5000)])
print("spilled", flush=True)
time.sleep(600)
"""


def test_a_store_locked_left_mid_write_or_logging_elsewhere_is_read_or_refused(
    tmp_path, monkeypatch
):
    import sqlite3

    from runner.tracking import stores

    tables = ("CREATE TABLE experiments (id INTEGER)", "CREATE TABLE alembic_version (v TEXT)")
    # Locked throughout by another writer: said so, within the bound (shortened here).
    locked = _database(tmp_path / "locked.db", *tables)
    holder = sqlite3.connect(locked, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    monkeypatch.setattr(stores, "CHECK_SECONDS", 1)
    with pytest.raises(stores.UserError, match="stayed locked by another process for 1 s"):
        stores.check_sqlite_store(f"sqlite:///{locked}")
    holder.execute("ROLLBACK")
    holder.close()
    # Killed mid-transaction: its hot journal is for a writer to roll back; the store is still
    # recognised, and neither file is changed.
    stopped = _database(tmp_path / "stopped.db", *tables, "CREATE TABLE runs (payload BLOB)")
    writer = subprocess.Popen(
        [sys.executable, "-c", STOPPED_MID_WRITE, str(stopped)], stdout=subprocess.PIPE, text=True
    )
    assert writer.stdout is not None and writer.stdout.readline() == "spilled\n"
    writer.kill()
    writer.wait()
    journal = tmp_path / "stopped.db-journal"
    before = digest(stopped), digest(journal)
    assert {"experiments", "alembic_version"} <= (stores.sqlite_tables(stopped) or set())
    assert (digest(stopped), digest(journal)) == before
    # Another program's database in write-ahead logging, its tables still in the log: refused.
    logging = sqlite3.connect(tmp_path / "logging.db")
    logging.execute("PRAGMA journal_mode=WAL")
    logging.execute("CREATE TABLE events (id INTEGER)")
    logging.commit()
    with pytest.raises(ValueError, match="write-ahead logging"):
        stores.sqlite_tables(tmp_path / "logging.db")
    logging.close()
