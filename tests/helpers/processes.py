"""Checking real multi-process runs."""

from __future__ import annotations

# A gloo process group can abort its process at interpreter exit, after all work and
# destroy_process_group() are done: "terminate called without an active exception"
# (pytorch/pytorch#190489). Seen here with torch 2.14 in about one run in five of a plain
# torch script that uses no samplerlab code at all.
GLOO_TEARDOWN_ABORT = "terminate called without an active exception"


def check_exit(returncode: int, stderr: str, completed: bool) -> None:
    """A rank succeeded, or finished all its work (``completed``) and then hit only the known
    gloo teardown abort."""
    if returncode == 0:
        return
    assert completed and GLOO_TEARDOWN_ABORT in stderr, stderr[-3000:]
