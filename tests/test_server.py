"""A real PostgreSQL and a real `mlflow server` (`python -m runner.server`), a real sweep into
them with the joblib launcher, every run read back complete."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from runner.server import free_port, wait_until_healthy

HAS_POSTGRES = bool(
    shutil.which("initdb") or list(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
)
pytestmark = [
    pytest.mark.postgres,  # a real PostgreSQL and MLflow server
    pytest.mark.skipif(
        not HAS_POSTGRES and not os.environ.get("CI"),
        reason="PostgreSQL is not installed (make install-server); CI always runs this",
    ),
]


@pytest.fixture
def server_folder():
    """Where the postgres user may go (pytest's own temporary folders are root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="samplerlab-server-", dir="/var/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


SERVER = [sys.executable, "-m", "runner.server"]


def test_a_joblib_sweep_into_a_postgres_backed_server(tmp_path, server_folder):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    folder = server_folder
    # To a file: a pipe nobody reads fills with the server's request log and stalls the server.
    log = tmp_path / "server.log"
    server = subprocess.Popen(
        [*SERVER, "--port", str(port), "--folder", str(folder), "--workers", "1"],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until_healthy(url, server)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "runner",
                "-m",
                "hydra/launcher=joblib",
                "hydra.launcher.n_jobs=2",
                "sampler=uniform,hard_mined",
                "trainer.epochs=2",
                "trainer.progress=false",
                "tracking=server",
                f"tracking.uri={url}",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        client = MlflowClient(url)
        experiment = client.get_experiment_by_name("samplerlab").experiment_id
        runs = client.search_runs([experiment])
        (parent,) = [r for r in runs if r.data.tags.get("sweep") == "parent"]
        children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        assert parent.info.status == "FINISHED" and len(runs) == 3
        assert sorted(c.info.run_name for c in children) == [
            "hard_mined-synthetic_lt-s0",
            "uniform-synthetic_lt-s0",
        ]
        for child in children:
            run_id = child.info.run_id
            assert child.info.status == "FINISHED" and child.data.params["trainer.epochs"] == "2"
            for key in ("train/loss", "test/balanced_accuracy", "sampling/target/class_9"):
                assert [m.step for m in client.get_metric_history(run_id, key)] == [1, 2], key
            assert "final/balanced_accuracy" in child.data.metrics
            artifacts = {a.path for a in client.list_artifacts(run_id)}
            assert {
                "config.yaml",
                "classification_report.txt",
                "confusion_matrix.png",
                "sampled_class_shares.png",
                "checkpoint",
            } <= artifacts
            png = client.download_artifacts(run_id, "confusion_matrix.png", str(tmp_path))
            assert Path(png).read_bytes()[:4] == b"\x89PNG"
        # Artifacts went through the server into its own folder.
        assert list((folder / "artifacts").rglob("checkpoint.pt"))
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=90) == 0, log.read_text()[-3000:]
    assert not (folder / "postgres" / "data" / "postmaster.pid").exists()  # stopped too
