"""Shared fixtures. Expensive things (trees, builds) are cached under PATCHKIT_CACHE and shared
by every test of a run, and by later runs: one build per tree content."""
import logging
import subprocess

import pytest

# pyproject turns on live INFO logging for patchkit's progress; httpx would log every /slots poll
for noisy in ("httpx", "httpcore", "git"):
    logging.getLogger(noisy).setLevel(logging.WARNING)


def pytest_collection_modifyitems(items):
    for item in items:
        if "/real/" in str(item.fspath):
            item.add_marker(pytest.mark.real)


def _llama_servers() -> set[int]:
    """llama-server processes of this cache (another patchkit run on the machine is not ours)."""
    from toolkit import cache

    out = subprocess.run(["pgrep", "-x", "llama-server"], capture_output=True, text=True).stdout
    mine = set()
    for pid in out.split():
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
        except OSError:
            continue
        if str(cache.root()) in cmd:
            mine.add(int(pid))
    return mine


@pytest.fixture(autouse=True)
def no_orphan_servers():
    """Every test must stop every llama-server it started."""
    before = _llama_servers()
    yield
    left = _llama_servers() - before
    assert not left, f"llama-server processes left running: {sorted(left)}"
