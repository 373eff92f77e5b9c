"""A shared tracking server on this machine: PostgreSQL for runs, a folder for artifacts, and
``mlflow server`` in front of both on 127.0.0.1.

    python -m runner.tracking.server [--port 5000] [--folder server]      # make server

Runs point at it with ``tracking=server`` (``tracking.uri=http://127.0.0.1:5000``). The
database lives in ``<folder>/postgres`` (created by ``initdb`` on first start, as the
``postgres`` user when run as root), artifacts in ``<folder>/artifacts``. The server runs in the
foreground; Ctrl-C or SIGTERM stops MLflow, then PostgreSQL.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from runner.errors import UserError
from runner.explain import exit_with
from runner.extras import require

DATABASE = "mlflow"
# MLflow 3 starts job-queue consumers (for its GenAI features) beside the server: not needed here.
QUIET_SERVER = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _postgres_bin(name: str) -> str:
    """PostgreSQL's server programs (Debian keeps them off PATH)."""
    found = shutil.which(name) or next(
        (str(p) for p in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))), None
    )
    if found is None:
        raise SystemExit(
            f"samplerlab: PostgreSQL's {name} is not installed; run `make install-server` "
            "(apt-get install postgresql) first"
        )
    return found


def _run(command: list[str]) -> str:
    """Run a PostgreSQL program; its own message if it fails."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        program = Path(command[command.index("--") + 1] if "--" in command else command[0]).name
        raise SystemExit(
            f"samplerlab: {program} failed: {(done.stderr or done.stdout).strip()[-500:]}"
        )
    return done.stdout


def _as_owner(command: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, run its programs as the postgres user."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


class Postgres:
    """One PostgreSQL cluster in ``folder``, listening on 127.0.0.1:``port`` only."""

    def __init__(self, folder: Path, port: int) -> None:
        self.folder, self.port = folder.resolve(), port
        self.data, self.sockets = self.folder / "data", self.folder / "sockets"

    @property
    def uri(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{DATABASE}"

    def start(self) -> None:
        self.sockets.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres")
            shutil.chown(self.sockets, "postgres")
            reachable = subprocess.run(_as_owner(["test", "-w", str(self.folder)])).returncode == 0
            if not reachable:
                raise SystemExit(
                    f"samplerlab: the postgres user cannot reach {self.folder}; choose a --folder "
                    "whose parent folders others may enter (e.g. under /srv or /var/tmp)"
                )
        if not (self.data / "PG_VERSION").is_file():
            initdb = [_postgres_bin("initdb"), "-D", str(self.data), "-U", "postgres"]
            _run(_as_owner([*initdb, "--auth=trust"]))  # loopback only, see start's options
        options = f"-p {self.port} -k {self.sockets} -c listen_addresses=127.0.0.1"
        log = str(self.folder / "postgres.log")
        _run(
            _as_owner(
                [
                    _postgres_bin("pg_ctl"),
                    "-D",
                    str(self.data),
                    "-o",
                    options,
                    "-l",
                    log,
                    "-w",
                    "start",
                ]
            )
        )
        psql = ["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-tAc"]
        if not _run([*psql, f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'"]).strip():
            _run([*psql, f"CREATE DATABASE {DATABASE}"])

    def stop(self) -> None:
        subprocess.run(
            _as_owner([_postgres_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"]),
            capture_output=True,
        )


def wait_until_healthy(url: str, process: subprocess.Popen[bytes], timeout: float = 120) -> None:
    """Until ``url``/health answers; an error if ``process`` exits or the time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"samplerlab: mlflow server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"samplerlab: mlflow server did not answer at {url} within {timeout:.0f} s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, default=5000, help="MLflow server port on 127.0.0.1")
    parser.add_argument(
        "--db-port", type=int, default=None, help="PostgreSQL port (default: a free one)"
    )
    parser.add_argument("--folder", default="server", help="database and artifacts live here")
    parser.add_argument("--workers", type=int, default=2, help="mlflow server worker processes")
    args = parser.parse_args(argv)
    try:  # the server's PostgreSQL store is an extra; say so before starting anything
        require("psycopg", "server", "runner.tracking.server (a PostgreSQL store)")
    except UserError as error:
        exit_with(error)
    folder = Path(args.folder).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    database = Postgres(folder / "postgres", args.db_port or free_port())
    database.start()
    url = f"http://127.0.0.1:{args.port}"
    mlflow = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            database.uri,
            "--artifacts-destination",
            str((folder / "artifacts").resolve()),
            "--host",
            "127.0.0.1",
            "--port",
            str(args.port),
            "--workers",
            str(args.workers),
        ],
        start_new_session=True,  # its workers are stopped with it, as a group
        env={**os.environ, **QUIET_SERVER},
    )

    def on_signal(signum: int, frame: object) -> None:
        raise _Stop

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        wait_until_healthy(url, mlflow)
        print(
            f"samplerlab: MLflow server at {url} (PostgreSQL on 127.0.0.1:{database.port}, "
            f"artifacts in {folder / 'artifacts'}); use tracking=server tracking.uri={url}",
            flush=True,
        )
        mlflow.wait()
    except _Stop:
        pass
    finally:  # outside the signal handler: waiting inside it can deadlock on Popen's lock
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if mlflow.poll() is None:
            os.killpg(mlflow.pid, signal.SIGTERM)
            try:
                mlflow.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(mlflow.pid, signal.SIGKILL)
                mlflow.wait()
        database.stop()


class _Stop(Exception):
    """SIGTERM or SIGINT: stop the server."""


if __name__ == "__main__":
    main()
