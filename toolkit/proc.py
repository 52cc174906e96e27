"""The only gateway to subprocesses.

Every external command goes through `run` (wait for it), `stream` (wait, line by line,
for progress) or `spawn` (long-lived, e.g. llama-server). Each one:
  - checks the program exists first (`shutil.which`) and says which one is missing;
  - logs the shlex-quoted argv;
  - runs in its own process group, so that on timeout, error or Ctrl-C the whole
    group (compiler children, server threads) is killed, never orphaned;
  - has a timeout.
"""
from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from .errors import EnvironmentProblem, PatchkitError

log = logging.getLogger("patchkit.proc")

# Every process this patchkit process starts inherits this mark in its environment (children,
# their children: ninja's compilers, llama-server). A Ctrl-C can land between fork and the line
# that records the child (inside Popen, or before its result is stored): measured under load,
# `verify` interrupted that way left a llama-server behind. stop_all() therefore also sweeps
# /proc for the mark, so no child outlives us whatever instant the signal chose.
OWNER = "PATCHKIT_OWNER"
os.environ[OWNER] = f"{os.getpid()}-{time.time_ns()}"


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    rc: int
    out: str
    err: str
    seconds: float


def quote(argv: Sequence[str]) -> str:
    return shlex.join([str(a) for a in argv])


def require(program: str, why: str = "") -> str:
    path = shutil.which(program)
    if not path:
        raise EnvironmentProblem(
            f"'{program}' was not found on PATH{' (' + why + ')' if why else ''}.",
            hint="Install it (e.g. `apt-get install " + program + "`) and try again.",
        )
    return path


def _kill_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """Terminate the process group, escalate to SIGKILL after `grace` seconds."""
    if proc.poll() is not None:
        # the leader is gone; children may remain in its group
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run(
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    check: bool = True,
    error: type[PatchkitError] = PatchkitError,
    what: str = "",
    input: str | None = None,
) -> Result:
    """Run to completion and capture output. `check` raises `error` on non-zero exit."""
    argv = [str(a) for a in argv]
    require(argv[0])
    log.debug("$ %s", quote(argv))
    start = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise error(f"{what or argv[0]} timed out after {timeout:.0f} s: {quote(argv)}")
    except BaseException:
        _kill_group(proc)
        raise
    res = Result(tuple(argv), proc.returncode, out, err, time.monotonic() - start)
    if check and res.rc != 0:
        tail = (err or out).strip().splitlines()[-5:]
        raise error(
            f"{what or argv[0]} failed with exit code {res.rc}: {quote(argv)}"
            + (("\n  " + "\n  ".join(tail)) if tail else "")
        )
    return res


def stream(
    argv: Sequence[str],
    *,
    log_path: Path,
    on_line: Callable[[str], None] | None = None,
    cwd: str | os.PathLike | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 3600,
) -> Result:
    """Run, appending merged stdout+stderr to `log_path`, calling `on_line` per line.

    Returns the Result (out = whole output); never raises on a non-zero exit, so the
    caller can point at the first compiler error itself.
    """
    argv = [str(a) for a in argv]
    require(argv[0])
    log.debug("$ %s", quote(argv))
    start = time.monotonic()
    lines: list[str] = []
    with open(log_path, "a", encoding="utf-8", errors="replace") as logf:
        logf.write(f"$ {quote(argv)}\n")
        logf.flush()
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                logf.write(line)
                lines.append(line)
                if on_line:
                    on_line(line.rstrip("\n"))
                if time.monotonic() - start > timeout:
                    raise EnvironmentProblem(f"{argv[0]} exceeded {timeout:.0f} s: {quote(argv)}")
            proc.wait()
        except BaseException:
            _kill_group(proc)
            raise
    return Result(tuple(argv), proc.returncode, "".join(lines), "", time.monotonic() - start)


class Spawned:
    """A long-lived child in its own process group; `stop()` kills the whole group."""

    def __init__(self, argv: Sequence[str], *, log_path: Path, env: dict[str, str] | None = None,
                 cwd: str | os.PathLike | None = None):
        self.argv = [str(a) for a in argv]
        require(self.argv[0])
        log.debug("$ %s &", quote(self.argv))
        self.log_path = log_path
        self._logf = open(log_path, "ab")
        self.proc = subprocess.Popen(
            self.argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _LIVE.add(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    @contextmanager
    def paused(self):
        """SIGSTOP the child for the duration (every thread stops at once); SIGCONT always follows.
        A child that is already gone is not an error here: what it did not answer is recorded."""
        try:
            os.kill(self.proc.pid, signal.SIGSTOP)
        except ProcessLookupError:
            pass
        try:
            yield
        finally:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def returncode(self) -> int | None:
        return self.proc.poll()

    def stop(self, grace: float = 5.0) -> int | None:
        try:
            _kill_group(self.proc, grace)
        finally:
            self._logf.close()
            _LIVE.discard(self)
        return self.proc.returncode


# Children still running; the CLI's signal handler and atexit stop them all.
_LIVE: set[Spawned] = set()


def stop_all(settle: float = 2.0) -> None:
    for child in list(_LIVE):
        child.stop(grace=2.0)
    # A child caught inside execve has no readable environment for an instant, so one sweep can
    # miss it and it runs on (a clean-clone CI run under load left a llama-server behind after a
    # Ctrl-C). Sweep until two passes in a row find nothing (a killed child is a zombie, whose
    # environment reads empty), for at most `settle` seconds.
    deadline, quiet = time.monotonic() + settle, 0
    while quiet < 2 and time.monotonic() < deadline:
        found = marked(os.environ[OWNER])
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        quiet = 0 if found else quiet + 1
        if quiet < 2:
            time.sleep(0.02)


def marked(value: str, name: str = OWNER) -> list[int]:
    """Processes other than this one whose environment carries name=value."""
    want = f"{name}={value}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if want in fh.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            continue
    return found
