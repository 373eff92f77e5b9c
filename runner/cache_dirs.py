"""Where samplerlab keeps what it reuses between runs: the user's cache folder, never the
source tree or the installed package.

The root is ``$SAMPLERLAB_CACHE`` when set, else the platform's user cache folder for
samplerlab (``platformdirs.user_cache_dir``: ``~/.cache/samplerlab`` on Linux, or under
``$XDG_CACHE_HOME``; ``~/Library/Caches/samplerlab`` on macOS). Each kind of cache has its own
folder under it, and a config key that puts it elsewhere (``features.cache_dir``,
``prefixes.cache_dir``). Everything here is derived data: deleting a folder costs the time to
compute it again (``samplerlab cache clear``). Read at call time, so that a process that sets
``SAMPLERLAB_CACHE`` after import (a test, a forked job) is heard.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

ENV = "SAMPLERLAB_CACHE"
# Each cache: its folder under the root, and what it holds (for `samplerlab cache list`).
KINDS = {
    "features": "a frozen backbone's features, a bank per backbone with a row per image (model.freeze=true)",
    "prefixes": "a sweep's shared training snapshots (removed when the sweep finishes)",
    "images": "an image folder's decoded images, one file per folder, and a note of its files' digest per state of the folder (data=image_folder_lt)",
}


def root() -> Path:
    """The folder every samplerlab cache lives under."""
    chosen = os.environ.get(ENV)
    if chosen:
        return Path(chosen).expanduser()
    return Path(platformdirs.user_cache_dir("samplerlab", appauthor=False))


def folder(kind: str) -> Path:
    """The default folder of the cache ``kind`` (one of :data:`KINDS`)."""
    if kind not in KINDS:
        raise KeyError(f"no cache named {kind!r}; the caches: {', '.join(KINDS)}")
    return root() / kind
