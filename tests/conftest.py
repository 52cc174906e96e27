"""Shared fixtures. Expensive things (trees, builds) are cached under PATCHKIT_CACHE and shared
by every test of a run, and by later runs: one build per tree content."""
import logging
import os
import subprocess
import threading
import time
import uuid

import pytest

from toolkit import runner

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
    if WORKER and "/real/" in nodeid:    # a fast test ends in milliseconds: -v's line says enough
        logging.getLogger("patchkit.tests").info(f"start {_running['test']}")


def _watchdog() -> None:
    """A test's own steps say what they do (builds, runs, fetches); anything else that goes quiet
    for QUIET_LIMIT (a long assertion loop, git work, a server taking its time) is named here."""
    say = logging.getLogger("patchkit.tests")
    while True:
        time.sleep(2)
        if time.monotonic() - _last_record.at >= QUIET_LIMIT:
            say.info(f"still in {_running['test']} ({time.monotonic() - _running['since']:.0f} s into it)")


# Two test processes (pytest-xdist, `-n 2` in ci/run.sh): a worker's log_cli output is not shown, so
# each worker appends its log lines to one relay file and the controlling process prints them as
# they come, prefixed with the worker's name; the watchdog runs where the tests run.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
RELAY_ENV = "PATCHKIT_TEST_RELAY"


class _Relay(logging.Handler):
    def __init__(self, path: str) -> None:
        super().__init__(logging.INFO)
        self.fh = open(path, "a", buffering=1)
        self.setFormatter(logging.Formatter(f"  %(asctime)s [{WORKER}] %(name)s: %(message)s", "%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        self.fh.write(self.format(record) + "\n")


def _tail(path: str) -> None:
    import sys
    with open(path) as fh:
        while True:
            line = fh.readline()
            if line:
                sys.stderr.write(line)
                sys.stderr.flush()
            else:
                time.sleep(0.5)


def pytest_configure(config):
    workers = getattr(config.option, "numprocesses", None)
    if not WORKER and not os.environ.get(runner.SHARED_ENV):
        # every comparison against one base in this session reads that base's runs once measured
        # (toolkit/runner.py `shared`), in every worker and every `patchkit` subprocess: they inherit it
        import shutil
        import tempfile
        where = tempfile.mkdtemp(prefix="patchkit-test-runs-")
        os.environ[runner.SHARED_ENV] = where
        config.add_cleanup(lambda: shutil.rmtree(where, ignore_errors=True))
    if WORKER and os.environ.get(RELAY_ENV):
        logging.getLogger().addHandler(_Relay(os.environ[RELAY_ENV]))
    elif not WORKER and workers:
        import tempfile
        fd, path = tempfile.mkstemp(prefix="patchkit-test-relay-", suffix=".log")
        os.close(fd)
        os.environ[RELAY_ENV] = path         # the workers inherit it: they start after configure
        config.add_cleanup(lambda: os.path.exists(path) and os.unlink(path))
        threading.Thread(target=_tail, args=(path,), daemon=True, name="worker-log-relay").start()
    if WORKER or not workers:
        threading.Thread(target=_watchdog, daemon=True, name="quiet-watchdog").start()


def pytest_terminal_summary(terminalreporter):
    """What the session's runs shared (PATCHKIT_SHARED_RUNS, set above; toolkit/runner.py's ledger)."""
    line = None if WORKER else runner.ledger_summary(os.environ.get(runner.SHARED_ENV, ""))
    if line:
        terminalreporter.write_line(line)


# Every real file by its measured time, longest first (a warm clean-clone run, docs/measured.md):
# under `--dist loadfile` a file runs in one process, in the collection's order, so the longest-first
# order leaves short files for the end, where two processes finish within seconds of each other
# (measured: test_operators ~4 min alone at the tail under xdist's default; test_witness and
# test_reviewer_path 2 min alone at the tail with only the six longest ranked). A file not listed
# runs after these.
LONG_FIRST = ("test_operators.py", "test_traffic.py", "test_preemption_edge.py", "test_families.py",
              "test_apply.py", "test_export.py", "test_verify.py", "test_gate.py", "test_faults.py",
              "test_family_folder.py", "test_reviewer_path.py", "test_random_workloads.py", "test_preemption.py",
              "test_witness.py", "test_mutants.py", "test_cli_options.py", "test_upstream.py", "test_metrics.py",
              "test_promises.py", "test_pin_gate.py", "test_first_hour.py", "test_foundation.py",
              "test_outcomes.py", "test_referee_candidate.py", "test_report_html.py", "test_upstream_unified.py",
              "test_nightly_mix.py")


def pytest_collection_modifyitems(items):
    for item in items:
        if "/real/" in str(item.fspath):
            item.add_marker(pytest.mark.real)
    rank = {f"real/{name}": k for k, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(f"{item.path.parent.name}/{item.path.name}", len(rank)))  # stable


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
