"""A real local Ray cluster (``ray start --head``) and a real sweep on it through
hydra-ray-launcher (``hydra/launcher=ray_cluster``): the children join the sweep's parent run."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from mlflow.tracking import MlflowClient

from runner.tracking.server import free_port

HAS_RAY = importlib.util.find_spec("hydra_plugins.hydra_ray_launcher") is not None
pytestmark = [
    pytest.mark.slow,  # real CLI subprocesses, training, signals
    pytest.mark.skipif(
        not HAS_RAY and not os.environ.get("SAMPLERLAB_TEST_RAY"),
        reason="hydra-ray-launcher is not installed (pip install -e '.[ray]')",
    ),
]


@pytest.fixture
def ray_head(monkeypatch):
    """A one-node Ray cluster of its own (its ports, its folder) on this machine; its address."""
    # Without token authentication, for the cluster and the sweep alike: once a token exists in
    # ~/.ray/auth_token (a plain ray.init() writes one), ray start turns it on, and here its
    # raylet then died at startup ("Check failed" in node_manager.cc; Ray 2.60.0).
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    # SIGTERM stops the cluster at once (by default its node first drains, for up to 30 s).
    monkeypatch.setenv("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0")
    port = free_port()
    # Ray's sockets live in its folder: a short path (a Unix socket's path has ~107 bytes).
    folder = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    head = subprocess.Popen(
        [
            *[sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block"],
            f"--port={port}",
            f"--ray-client-server-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            "--num-cpus=2",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={folder}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    deadline = time.monotonic() + 120
    for line in head.stdout:
        lines.append(line)
        if "Ray runtime started" in line:
            break
        assert time.monotonic() < deadline, "".join(lines)[-3000:]
    assert head.poll() is None, "".join(lines)[-3000:]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        # --block: on SIGTERM the head stops every process of its cluster, and only those.
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
        head.stdout.close()
        shutil.rmtree(folder, ignore_errors=True)


def test_a_sweep_on_a_ray_cluster_joins_the_parent(ray_head, tmp_path, tracking_uri):
    done = subprocess.run(
        [
            *[sys.executable, "-m", "runner", "-m", "hydra/launcher=ray_cluster"],
            f"hydra.launcher.ray.init.address={ray_head}",
            "sampler=uniform,hard_mined",
            "trainer.epochs=2",
            "tracking.plots=false",
            f"tracking.uri={tracking_uri}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # Ray names the machine by its IP address: 127.0.0.1 becomes, e.g., 192.0.2.2.
    port = ray_head.rsplit(":", 1)[1]
    assert "Connecting to existing Ray cluster at address: " in done.stderr
    assert f":{port}...\n" in done.stderr
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("samplerlab").experiment_id
    runs = client.search_runs([experiment])
    (parent,) = [r for r in runs if r.data.tags.get("sweep") == "parent"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(runs) == 3 and parent.info.status == "FINISHED"
    assert sorted(c.info.run_name for c in children) == [
        "hard_mined-synthetic_lt-s0",
        "uniform-synthetic_lt-s0",
    ]
    for child in children:
        assert child.info.status == "FINISHED" and "test/recall/class_9" in child.data.metrics
    # The sweep's report lands on the parent run at the end, as with the basic launcher.
    assert "report.md" in {f.path for f in client.list_artifacts(parent.info.run_id)}
    # Each job ran as a Ray task in a Ray worker process, not in the sweep's own process.
    assert "(_run_job pid=" in done.stdout + done.stderr
