"""The GPU check script stays runnable on machines without a GPU (CI never has one)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.cli import run_python

pytestmark = [
    pytest.mark.gpu,  # the GPU check (on the CPU: it must fail honestly)
    pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU machine runs make gpu-check"),
]


def test_without_a_gpu_it_says_so_in_one_line(tmp_path):
    done = run_python("-m", "scripts.gpu_check", cwd=tmp_path, timeout=120, expect=2)
    assert done.stdout.strip().count("\n") == 0
    assert "needs a CUDA device" in done.stdout


def test_its_checks_run_and_fail_honestly_on_the_cpu(capsys):
    from runner.config import register
    from scripts.gpu_check import check_case

    register()
    ok, figures = check_case("small_cnn-digits", ["data=digits_lt", "model=small_cnn"], epochs=1)
    printed = capsys.readouterr().out
    assert not ok and "FAIL small_cnn-digits: model on the GPU" in printed
    assert "ok   small_cnn-digits: final metrics recorded" in printed
    assert figures["seconds_per_epoch"] > 0
