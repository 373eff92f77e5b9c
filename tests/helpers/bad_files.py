"""Files a user may point the runner at that it must refuse, each with what the refusal says."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def save_arrays(path: Path, **arrays) -> Path:
    """``arrays`` as a tensor file: ``.npz`` (numpy) or ``.pt`` (a dict saved by torch)."""
    if path.suffix == ".npz":
        np.savez(path, **arrays)
    else:
        torch.save(arrays, path)
    return path


# Ten blank samples of two classes: what the file lacks, not its values, is wrong.
BLANK_X, BLANK_Y = np.zeros((10, 3), np.float32), np.arange(10) % 2


def bad_file_cases(tmp: Path) -> list[tuple[list[str], str]]:
    """Bad files for ``tests/test_errors.py::bad_inputs`` (one or two lines, exit 2, no run
    recorded): the overrides and a string the message must hold."""
    folder = tmp / "tensor_files"
    folder.mkdir(exist_ok=True)
    corrupt = folder / "corrupt.npz"
    corrupt.write_bytes(b"not a zip")
    files = {
        "corrupt": corrupt,
        "no_y": save_arrays(folder / "no_y.npz", x=BLANK_X),
        "float_y": save_arrays(folder / "float_y.npz", x=BLANK_X, y=BLANK_Y.astype(np.float32)),
        "short_y": save_arrays(
            folder / "short_y.pt", x=torch.zeros(10, 3), y=torch.zeros(7).long()
        ),
    }
    bad = np.random.RandomState(0).randn(40, 3).astype(np.float32)
    labels = np.arange(40) % 2
    nan_x, inf_test = bad.copy(), bad[:8].copy()
    nan_x[13, 1], inf_test[5, 0] = np.nan, -np.inf
    files.update(
        nan_x=save_arrays(folder / "nan_x.npz", x=nan_x, y=labels),
        inf_x=save_arrays(
            folder / "inf_x.pt",
            x=torch.from_numpy(nan_x).nan_to_num(nan=np.inf),
            y=torch.from_numpy(labels),
        ),
        nan_test=save_arrays(
            folder / "nan_test.pt",
            x=torch.from_numpy(bad),
            y=torch.from_numpy(labels),
            x_test=torch.from_numpy(nan_x[10:18]),
            y_test=torch.from_numpy(labels[10:18]),
        ),
        inf_test=save_arrays(
            folder / "inf_test.npz", x=bad, y=labels, x_test=inf_test, y_test=labels[:8]
        ),
    )
    tensor = ["data=tensor_file"]
    return [
        ([*tensor, f"data.path={files['nan_x']}"], "x[13] (training and test samples) holds nan"),
        ([*tensor, f"data.path={files['inf_x']}"], "x[13] (training and test samples) holds inf"),
        ([*tensor, f"data.path={files['nan_test']}"], "x_test[3] (test samples) holds nan"),
        ([*tensor, f"data.path={files['inf_test']}"], "x_test[5] (test samples) holds -inf"),
        (tensor, "data.path"),
        ([*tensor, f"data.path={files['corrupt']}"], "cannot read it as .npz"),
        ([*tensor, f"data.path={files['no_y']}"], "missing key(s) ['y']"),
        ([*tensor, f"data.path={files['float_y']}"], "integer class indices"),
        ([*tensor, f"data.path={files['short_y']}"], "7 labels for 10 samples"),
        (["data=torchvision", f"data.dataset.root={tmp / 'nowhere'}"], "data.dataset"),
    ]
