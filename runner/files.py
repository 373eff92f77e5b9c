"""Files a reader finds whole or not at all (checkpoints, cached features, decoded images)."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: Path, data: bytes | memoryview) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it (fsync, then rename), so
    that a kill never leaves half a file. An ``OSError`` (a full disk, a file-size limit, no
    permission) removes the temporary file, leaves any earlier ``path`` as it was, and is raised
    for the caller to explain.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> write_atomically(folder / "sub" / "a.bin", b"abc")
        >>> (folder / "sub" / "a.bin").read_bytes(), sorted(p.name for p in (folder / "sub").iterdir())
        (b'abc', ['a.bin'])
    """
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise
