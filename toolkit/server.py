"""llama-server lifecycle: start on a free 127.0.0.1 port, wait until ready, stop the group.

Ready means `/health` answers 200 AND the process is still alive. Stopping escalates
SIGTERM -> SIGKILL on the whole process group; `with Server(...)` stops it on any exit,
including errors and Ctrl-C.
"""
from __future__ import annotations

import os
import re
import socket
import ssl
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import httpx

from . import cache, proc
from .errors import ServerError

BIND_FAILED = ("couldn't bind", "Address already in use", "failed to bind")


@lru_cache(maxsize=32)
def _help(binary: str, stamp: tuple[int, int]) -> str:
    """The binary's --help, run once per binary ever: kept in the cache by its path and stamp (a
    rebuilt binary has another), as the facts of a tree are."""
    path = cache.sub("help") / f"{cache.digest(binary, stamp)}.txt"
    if path.exists():
        return path.read_text()
    r = proc.run([binary, "--help"], check=False, timeout=60)
    cache.write_atomic(path, r.out + r.err)
    return r.out + r.err


def adapt_args(binary: Path, args: Sequence[str]) -> list[str]:
    """The workload's flags in the words of an older llama-server that lacks some (layout A, 0.3.16,
    from its own --help): there `-fa` takes no value (off is its default), and there is no
    `--cache-ram` (no host prompt cache to disable) and no `-no-kvu` (one pool per sequence is its
    default). Each is dropped only where its absence means the setting asked for; anything else
    passes as it is, and the server names what it refuses. /slots, off by default there, is asked for."""
    st = Path(binary).stat()
    return translate(args, _help(str(binary), (st.st_mtime_ns, st.st_size)))


def translate(args: Sequence[str], text: str) -> list[str]:
    """adapt_args on a server's --help text."""
    fa_valued = re.search(r"--flash-attn\s+\[?\S*(on|off)", text) is not None
    out, i = [], 0
    while i < len(args):
        a, v = args[i], args[i + 1] if i + 1 < len(args) else None
        if a == "-fa" and not fa_valued and v in ("on", "off", "auto"):
            out += ["-fa"] if v == "on" else []
            i += 2
        elif a == "--cache-ram" and "--cache-ram" not in text:
            i += 2
        elif a == "-no-kvu" and "-no-kvu" not in text:
            i += 1
        else:
            out.append(a)
            i += 1
    if re.search(r"--slots\s+enable slots monitoring endpoint \(default: disabled\)", text):
        out.append("--slots")   # the poller's /slots (on by default from B on)
    return out


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 8) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n  ".join(lines[-n:])


@dataclass(frozen=True)
class Endpoint:
    url: str
    port: int
    log: Path


@lru_cache(maxsize=1)
def _tls() -> ssl.SSLContext:
    return ssl.create_default_context()


def local_client(**kw) -> httpx.Client:
    """An HTTP client for a server on 127.0.0.1: no proxy from the environment, and the process's
    one TLS context (it is never used over plain HTTP, but httpx builds one per client by default,
    loading the CA bundle: 24 ms a client, measured, paid by every server start and every user)."""
    return httpx.Client(trust_env=False, verify=_tls(), **kw)


class Server:
    def __init__(self, binary: Path, model: Path, args: Sequence[str], log_path: Path,
                 ready_timeout: float = 120.0, port: int | None = None, env: dict[str, str] | None = None):
        self.binary, self.model, self.args = Path(binary), Path(model), list(args)
        self.env = dict(env or {})  # added to the server's environment (a candidate's knobs, a mutant's id)
        self.log_path, self.ready_timeout, self.port = log_path, ready_timeout, port
        self.child: proc.Spawned | None = None
        self.endpoint: Endpoint | None = None
        # one client for every probe of this server: building an httpx client costs ~18 ms (its
        # SSL context), which the bench measured at ~2 s per warm demo when done per request
        self._http: httpx.Client | None = None

    def __enter__(self) -> Endpoint:
        return self.start()

    def __exit__(self, exc_type, *exc) -> None:
        # leaving on an exception (an abandoned start, Ctrl-C): nothing to wait for. A graceful
        # stop with streams still open costs ~1 s per stream (the server polls each connection)
        self.stop(grace=0.0 if exc_type else 5.0)

    def start(self) -> Endpoint:
        if not self.binary.exists():
            raise ServerError(f"no llama-server binary at {self.binary}; run `patchkit build` first.")
        if not self.model.exists():
            raise ServerError(f"model file {self.model} does not exist; run `patchkit model`.")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        attempts = 1 if self.port else 3  # a picked free port can be taken before we bind it
        for attempt in range(attempts):
            port = self.port or free_port()
            argv = [str(self.binary), "-m", str(self.model), "--host", "127.0.0.1", "--port", str(port),
                    *adapt_args(self.binary, self.args)]
            with open(self.log_path, "a") as fh:
                fh.write(f"\n# patchkit: start attempt {attempt + 1}\n")
            # sanitizer builds: report memory errors, not the upstream's leaks at exit; keep running
            # after a UBSan report so the whole log is read
            env = dict(os.environ, ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "detect_leaks=0"),
                       UBSAN_OPTIONS=os.environ.get("UBSAN_OPTIONS", "print_stacktrace=1"), **self.env)
            self.child = proc.Spawned(argv, log_path=self.log_path, env=env)
            try:
                self._wait_ready(port)
            except ServerError:
                self.stop()
                log = self.log_path.read_text(errors="replace")
                if not self.port and any(m in log.split("# patchkit: start attempt")[-1] for m in BIND_FAILED):
                    continue
                raise
            except BaseException:
                self.stop()
                raise
            self.endpoint = Endpoint(f"http://127.0.0.1:{port}", port, self.log_path)
            return self.endpoint
        raise ServerError(f"could not bind a free port after {attempts} attempts.", log=str(self.log_path))

    def _client(self) -> httpx.Client:
        if self._http is None:
            self._http = local_client()
        return self._http

    def _wait_ready(self, port: int) -> None:
        assert self.child is not None
        deadline = time.monotonic() + self.ready_timeout
        url = f"http://127.0.0.1:{port}/health"
        while time.monotonic() < deadline:
            if not self.child.alive():
                raise ServerError(
                    f"llama-server exited with code {self.child.returncode()} before it was ready:\n  "
                    + _tail(self.log_path), log=str(self.log_path))
            try:
                r = self._client().get(url, timeout=1.0)
                if r.status_code == 200 and self.child.alive():
                    return
            except httpx.HTTPError:
                pass
            # the tiny model is ready in tens of ms; a coarse poll would dominate every start
            time.sleep(0.01)
        raise ServerError(f"llama-server was not ready within {self.ready_timeout:.0f} s.", log=str(self.log_path))

    def alive(self) -> bool:
        return bool(self.child and self.child.alive())

    def paused(self):
        """Context manager: the whole server process stopped (SIGSTOP), resumed on exit."""
        assert self.child is not None
        return self.child.paused()

    def returncode(self) -> int | None:
        return self.child.returncode() if self.child else None

    def get(self, path: str, timeout: float = 2.0) -> httpx.Response:
        """GET on the running server (thread-safe: the /slots poller shares the client)."""
        assert self.endpoint is not None
        return self._client().get(self.endpoint.url + path, timeout=timeout)

    def post(self, path: str, body: dict, timeout: float = 10.0) -> httpx.Response:
        assert self.endpoint is not None
        return self._client().post(self.endpoint.url + path, json=body, timeout=timeout)

    def healthy(self) -> bool:
        if not self.endpoint or not self.alive():
            return False
        try:
            return self.get("/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, grace: float = 5.0) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
        if self.child is not None:
            self.child.stop(grace)
