"""Large allocations kept in the process while features are extracted.

glibc serves every allocation above 32 MiB (its largest mmap threshold) with a fresh ``mmap``
and returns it with ``munmap`` when freed. A backbone's activations at 224 pixels are hundreds
of MiB a batch, so every batch maps them again and the kernel zero-fills them page by page:
EfficientNet-Lite0 at 224 px spent as much system time as user time on minor page faults.
:func:`kept_heap` tells glibc (``mallopt``) to serve them from the heap instead and not to trim
it, so the next batch reuses the same pages; the settings are put back after and the freed
memory returned (``malloc_trim``). Only the memory's placement changes: the numbers computed
are the same (a test checks the features bit for bit).

On a C library other than glibc (macOS, musl) it does nothing. glibc offers no way to read the
settings back, so "back" is glibc's defaults (at most 65,536 mapped chunks, trim above 128 KiB)
and its threshold no longer adapts after the first use (``mallopt`` turns that off).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
from collections.abc import Iterator
from contextlib import contextmanager

# mallopt parameters, from glibc's <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
DEFAULT_MMAP_MAX = 65536
DEFAULT_TRIM_THRESHOLD = 128 * 1024
NO_TRIM = -1  # never (mallopt(3): -1 disables trimming; 2**31 - 1, an int's most, is only 2 GiB)


def glibc() -> ctypes.CDLL | None:
    if platform.libc_ver()[0] != "glibc":
        return None
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


@contextmanager
def kept_heap(enabled: bool = True) -> Iterator[bool]:
    """Within the block, large allocations come from a heap that is not trimmed (see the
    module); yields whether that is so (False: not glibc, or not ``enabled``)."""
    libc = glibc() if enabled else None
    if libc is None:
        yield False
        return
    libc.mallopt(M_MMAP_MAX, 0)
    libc.mallopt(M_TRIM_THRESHOLD, NO_TRIM)
    try:
        yield True
    finally:
        libc.mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
        libc.mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)
        libc.malloc_trim(0)
