"""Shared fixtures. Expensive things (trees, builds) are cached under PATCHKIT_CACHE and shared
by every test of a run, and by later runs: one build per tree content."""
import logging
import os
import subprocess
import threading
import time
import uuid

import pytest

# pyproject turns on live INFO logging for patchkit's progress; httpx would log every /slots poll
for noisy in ("httpx", "httpcore", "git"):
    logging.getLogger(noisy).setLevel(logging.WARNING)


class _LastRecord(logging.Handler):
    """When the last log line was written: the watchdog below speaks only after a quiet spell."""

    def __init__(self) -> None:
        super().__init__()
        self.at = time.monotonic()

    def emit(self, record: logging.LogRecord) -> None:
        self.at = time.monotonic()


_last_record = _LastRecord()
logging.getLogger().addHandler(_last_record)
_running = {"test": "(collecting)", "since": time.monotonic()}
QUIET_LIMIT = 20.0  # a CI log silent for longer reads as a hang (issue 21: none over 30 s)


def pytest_runtest_logstart(nodeid, location):
    _running.update(test=nodeid.split("::", 1)[-1], since=time.monotonic())


def _watchdog() -> None:
    """A test's own steps say what they do (builds, runs, fetches); anything else that goes quiet
    for QUIET_LIMIT (a long assertion loop, git work, a server taking its time) is named here."""
    say = logging.getLogger("patchkit.tests")
    while True:
        time.sleep(2)
        if time.monotonic() - _last_record.at >= QUIET_LIMIT:
            say.info(f"still in {_running['test']} ({time.monotonic() - _running['since']:.0f} s into it)")


threading.Thread(target=_watchdog, daemon=True, name="quiet-watchdog").start()


def pytest_collection_modifyitems(items):
    for item in items:
        if "/real/" in str(item.fspath):
            item.add_marker(pytest.mark.real)


# Every process this test session starts inherits this marker, so the orphan check counts only
# our own servers, not those of another patchkit run on the machine (a second checkout's tests).
SESSION = f"PATCHKIT_TEST_SESSION={uuid.uuid4().hex}"
os.environ["PATCHKIT_TEST_SESSION"] = SESSION.split("=", 1)[1]


def _llama_servers() -> set[int]:
    """llama-server processes started by this test session."""
    out = subprocess.run(["pgrep", "-x", "llama-server"], capture_output=True, text=True).stdout
    mine = set()
    for pid in out.split():
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if SESSION in env:
            mine.add(int(pid))
    return mine


@pytest.fixture(autouse=True)
def no_orphan_servers():
    """Every test must stop every llama-server it started."""
    before = _llama_servers()
    yield
    left = _llama_servers() - before
    assert not left, f"llama-server processes left running: {sorted(left)}"
