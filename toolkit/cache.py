"""Where patchkit keeps downloads, trees, builds, models and ccache: one root.

PATCHKIT_CACHE overrides the default (~/.cache/patchkit, or $XDG_CACHE_HOME/patchkit).
"""
from __future__ import annotations

import fcntl
import hashlib
import os
from contextlib import contextmanager
from pathlib import Path


def root() -> Path:
    env = os.environ.get("PATCHKIT_CACHE")
    if env:
        base = Path(env)
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "patchkit"
    base.mkdir(parents=True, exist_ok=True)
    return base.resolve()


def sub(*parts: str) -> Path:
    p = root().joinpath(*parts)
    p.mkdir(parents=True, exist_ok=True)
    return p


def digest(*items: object, n: int = 16) -> str:
    h = hashlib.sha256()
    for it in items:
        h.update(repr(it).encode())
        h.update(b"\0")
    return h.hexdigest()[:n]


@contextmanager
def locked(path: Path):
    """An exclusive advisory lock, so two patchkit processes never share a work dir at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
