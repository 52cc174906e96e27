"""Where patchkit keeps downloads, trees, builds, models and ccache: one root.

PATCHKIT_CACHE overrides the default (~/.cache/patchkit, or $XDG_CACHE_HOME/patchkit).
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable


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


def write_atomic(path: Path, text: str | bytes, mode: int | None = None) -> None:
    """Write a cache entry whole or not at all: two processes (xdist workers, a CLI subprocess)
    may make the same entry at once, and a reader must never see half of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    if isinstance(text, bytes):
        tmp.write_bytes(text)
    else:
        tmp.write_text(text)
    if mode is not None:
        tmp.chmod(mode)
    os.replace(tmp, path)


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


def kept(name: str, make: Callable[[], dict | None]) -> tuple[dict | None, bool]:
    """A JSON document under schemata/ made once per content (`name` carries the content's
    digest): under the entry's lock, which prune takes too, it is read back (and marked used) or
    made by `make` and kept; a None from `make` keeps nothing. Returns (the document as JSON reads
    it back, either way, so both paths give the same types; whether it was read back)."""
    import json
    path = sub("schemata") / f"{name}.json"
    with locked(path.with_name(path.name + ".lock")):
        if path.exists():
            touch(path)
            return json.loads(path.read_text()), True
        doc = make()
        if doc is None:
            return None, False
        text = json.dumps(doc)
        write_atomic(path, text)
        return json.loads(text), False


# ---------------------------------------------------------------- size and pruning

# kind -> folder; the order is the order `patchkit cache` prints
KINDS = {"sdists": "sdists", "trees": "trees", "workspaces": "work", "binaries": "bins", "models": "models",
         "ccache": "ccache", "harnesses": "harness", "measurements": "sensitivity", "facts": "facts",
         "server help": "help", "launchers": "launchers", "upstream tests": "upstream",
         "variant schemata": "schemata"}
# what prune may remove, least recently used first: each is rebuilt on demand (a workspace by an
# incremental build from ccache, a binary from its workspace, a fact or a server's --help by one
# parse or run, a variant schema by one parse); sdists, trees, models, ccache and upstream's test
# venvs stay (a tree is the user's embedded default; ccache keeps its own size limit; a venv costs
# a pip install)
PRUNABLE = ("work", "bins", "harness", "sensitivity", "facts", "help", "launchers", "schemata")
DEFAULT_MAX_GB = 20.0


def max_bytes() -> int:
    """PATCHKIT_CACHE_MAX_GB (default 20): the cap applied after every new build."""
    return int(float(os.environ.get("PATCHKIT_CACHE_MAX_GB", DEFAULT_MAX_GB)) * 1e9)


def _size(p: Path) -> int:
    if p.is_symlink() or p.is_file():
        return p.lstat().st_size
    total = 0
    for dirpath, _dirs, files in os.walk(p):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def usage() -> list[tuple[str, int, int]]:
    """(kind, bytes, entries) per kind, then 'other' (everything else under the root)."""
    base = root()
    out = []
    for kind, folder in KINDS.items():
        d = base / folder
        entries = [e for e in d.iterdir() if not e.name.endswith(".lock")] if d.is_dir() else []
        out.append((kind, sum(_size(e) for e in entries), len(entries)))
    rest = [e for e in base.iterdir() if e.name not in KINDS.values() and e.name != "locks"]
    out.append(("other", sum(_size(e) for e in rest), len(rest)))
    return out


def touch(entry: Path) -> None:
    """Mark a cache entry as used now (what prune orders by)."""
    try:
        os.utime(entry)
    except OSError:
        pass


def prune(cap: int | None = None, min_age_s: float = 3600.0) -> list[tuple[Path, int]]:
    """Remove the least recently used prunable entries until the whole cache is at most `cap`
    bytes (default max_bytes()). An entry another patchkit process holds (its lock taken), or used
    in the last `min_age_s` (a verify beside may be about to start its binary), is skipped, never
    removed under it. Returns what was removed, with sizes."""
    import shutil
    import time
    cap = max_bytes() if cap is None else cap
    total = sum(b for _k, b, _n in usage())
    if total <= cap:
        return []
    base = root()
    entries = [e for folder in PRUNABLE if (base / folder).is_dir() for e in (base / folder).iterdir()
               if not e.name.endswith(".lock")]
    entries.sort(key=lambda e: e.lstat().st_mtime)
    removed = []
    now = time.time()
    for e in entries:
        if total <= cap:
            break
        if now - e.lstat().st_mtime < min_age_s:
            continue
        lock = e.with_name(e.name + ".lock")
        size = _size(e)
        with open(lock, "w") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue          # in use by another patchkit process
            try:
                if e.is_dir() and not e.is_symlink():
                    shutil.rmtree(e, ignore_errors=True)
                else:
                    e.unlink(missing_ok=True)
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
        if e.parent.name != "work":
            lock.unlink(missing_ok=True)
        removed.append((e, size))
        total -= size
    return removed
