"""Workloads: data files in fixtures/workloads/ -> requests against a real llama-server -> outcomes.

A workload is a TOML file: server flags, requests (slot, prompt token ids, n_predict,
stream, start offset) and the expectations that apply. Running one starts a fresh server,
writes every request on its own socket at its start offset (one selector loop, h11), starts
again while the server did not launch them in lock-step, polls /slots for per-slot KV
occupancy, and records one `Outcome` per request. Recording never raises: whatever a
request experiences (HTTP error, in-band error, dropped stream, timeout) becomes data.
"""
from __future__ import annotations

import json
import re
import selectors
import socket
import threading
import time
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import h11
import httpx

from . import data_dir
from .errors import UsageError
from .server import Server

WORKLOAD_DIR = data_dir("fixtures", "workloads")
OUTCOMES = ("completed", "errored", "truncated", "crashed", "timeout")
N_SPECIAL = 3  # the tiny model's first 3 ids are <unk> <s> </s>: never in prompts


@dataclass(frozen=True)
class Request:
    slot: int
    prompt: tuple[int, ...]
    n_predict: int
    stream: bool = True
    start_ms: int = 0

    def body(self) -> dict:
        return {
            "prompt": list(self.prompt), "n_predict": self.n_predict, "id_slot": self.slot,
            "ignore_eos": True, "temperature": 0.0, "top_k": 1, "seed": 1, "stream": self.stream,
            "return_tokens": True, "cache_prompt": False,
        }


@dataclass(frozen=True)
class ServerFlags:
    ctx: int
    parallel: int
    kv_unified: bool = True
    cache_ram: int | None = 0
    threads: int = 2
    batch: int | None = None
    ubatch: int | None = None
    flash_attn: str = "off"
    draft: bool = False  # start with the tiny draft model (speculative decoding)
    extra: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        a = ["-c", str(self.ctx), "-np", str(self.parallel), "-t", str(self.threads), "-fa", self.flash_attn]
        a += ["-kvu"] if self.kv_unified else ["-no-kvu"]
        if self.cache_ram is not None:
            a += ["--cache-ram", str(self.cache_ram)]
        if self.batch:
            a += ["-b", str(self.batch)]
        if self.ubatch:
            a += ["-ub", str(self.ubatch)]
        return a + list(self.extra)


@dataclass(frozen=True)
class Expect:
    base: str = "all-error"         # all-error | unchanged | same
    candidate: str = "one-victim"   # one-victim | unchanged | same (as the base run)
    victim: int | None = None       # the slot arithmetic says must be evicted
    integrity: bool = True          # survivors' streams == control, victim's a prefix


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    sizing: str
    server: ServerFlags
    requests: tuple[Request, ...]
    expect: Expect
    path: Path | None = None

    def control(self) -> "Workload":
        """Same requests, a pool big enough for all of them: the no-overflow control."""
        demand = sum(len(r.prompt) + r.n_predict for r in self.requests)
        ctx = max(self.server.ctx, 2 * demand)
        ctx = -(-ctx // 256) * 256
        flags = ServerFlags(**{**self.server.__dict__, "ctx": ctx})
        return Workload(self.name + "/control", "no-overflow control", "", flags, self.requests,
                        Expect(base="unchanged", candidate="unchanged", integrity=False), self.path)


def prompt_ids(length: int, salt: int, n_vocab: int = 113) -> tuple[int, ...]:
    """Deterministic, non-special token ids."""
    span = n_vocab - N_SPECIAL
    return tuple(N_SPECIAL + (i * 7 + salt * 31 + (i * i) % 11) % span for i in range(length))


def available() -> list[str]:
    return sorted(p.stem for p in WORKLOAD_DIR.glob("*.toml"))


def load(name_or_path: str) -> Workload:
    path = Path(name_or_path)
    if not path.suffix:
        path = WORKLOAD_DIR / f"{name_or_path}.toml"
    if not path.exists():
        raise UsageError(f"no workload '{name_or_path}'. Known: {', '.join(available())}; or pass a .toml path.")
    try:
        data = tomllib.loads(path.read_text())
        return parse(data, path)
    except (tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as e:
        raise UsageError(f"invalid workload file {path}: {type(e).__name__}: {e}.")


def parse(data: dict, path: Path | None = None) -> Workload:
    known_top = {"name", "description", "sizing", "server", "requests", "expect"}
    unknown = set(data) - known_top
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)}")
    s = dict(data["server"])
    if "extra" in s:
        s["extra"] = tuple(s["extra"])
    flags = ServerFlags(**s)
    reqs = []
    for i, r in enumerate(data["requests"]):
        r = dict(r)
        if "prompt" in r:
            prompt = tuple(int(t) for t in r.pop("prompt"))
        else:
            prompt = prompt_ids(int(r.pop("prompt_len")), int(r.get("slot", i)))
        if not prompt:
            raise ValueError(f"request {i} has an empty prompt")
        reqs.append(Request(prompt=prompt, **r))
    slots = [r.slot for r in reqs]
    if len(set(slots)) != len(slots) or any(not 0 <= s < flags.parallel for s in slots):
        raise ValueError(f"request slots {slots} must be distinct and within 0..{flags.parallel - 1}")
    exp = Expect(**data.get("expect", {}))
    return Workload(data["name"], data.get("description", ""), data.get("sizing", ""), flags,
                    tuple(reqs), exp, path)


# ---------------------------------------------------------------- running

@dataclass(frozen=True)
class Outcome:
    slot: int
    outcome: str               # one of OUTCOMES
    http_status: int | None
    error: str | None
    done_seen: bool
    stop_type: str | None
    truncated: bool | None
    tokens_predicted: int | None
    tokens: tuple[int, ...]    # token ids received, in order
    prompt_tokens: int
    n_predict: int
    t_start: float             # seconds since the run's t0
    t_first: float | None
    t_end: float


@dataclass(frozen=True)
class Sample:
    t: float
    slot: int
    cells: int
    processing: bool


@dataclass(frozen=True)
class Event:
    """One overflow event the server logged: an eviction (patched) or an error-all (base)."""
    kind: str                  # "evict" | "error-all"
    off: int
    victim: int | None = None
    cells: int | None = None
    others: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Run:
    workload: str
    outcomes: tuple[Outcome, ...]
    samples: tuple[Sample, ...]
    events: tuple[Event, ...]
    alive_after: bool
    followup_ok: bool
    exit_code: int | None      # the server's, if it died during the run
    wall: float
    log: str
    attempts: int = 1            # runs discarded for a non-lock-step start, plus this one
    launch_spread_ms: float = 0.0
    sanitizer: tuple[str, ...] = ()  # AddressSanitizer / UBSan findings in the server log


SANITIZER_RE = re.compile(r"(ERROR: AddressSanitizer.*|runtime error: .*|ERROR: LeakSanitizer.*|"
                          r"WARNING: ThreadSanitizer.*)")


def sanitizer_findings(log_text: str) -> tuple[str, ...]:
    return tuple(m.group(1).strip()[:300] for m in SANITIZER_RE.finditer(log_text))


def _classify(req: Request, error, stop_type, truncated, predicted) -> str:
    if error is not None:
        return "errored"
    if stop_type is None:
        return "crashed"  # the stream ended with neither a final chunk nor an error
    short = predicted is not None and predicted < req.n_predict and stop_type != "eos"
    return "truncated" if truncated or short else "completed"


class _Exchange:
    """One request on its own socket, the response parsed with h11 (sans-IO HTTP/1.1).

    The runner opens every socket first, then writes all requests back to back in one
    tight loop (microseconds apart): the tiny model generates a token every ~0.2 ms, so
    requests sent even a few ms apart would start generating many steps apart.
    """

    def __init__(self, port: int, req: Request, t0: float):
        self.req, self.t0, self.port = req, t0, port
        self.sock: socket.socket | None = None
        self.conn = h11.Connection(h11.CLIENT)
        body = json.dumps(req.body()).encode()
        self.wire = self.conn.send(h11.Request(method="POST", target="/completion", headers=[
            ("Host", f"127.0.0.1:{port}"), ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))), ("Connection", "close")])) + self.conn.send(h11.Data(data=body)) \
            + self.conn.send(h11.EndOfMessage())
        self.status = self.error = self.stop_type = self.truncated = self.predicted = None
        self.t_start = 0.0
        self.t_first = None
        self.t_last = time.monotonic()
        self.done = False          # `data: [DONE]` (stream) or a whole 200 body (non-stream)
        self.finished = False      # the exchange is over, whatever happened
        self.kind: str | None = None
        self.tokens: list[int] = []
        self._buf = b""

    def send(self) -> None:
        # connect and write at once: the server's worker finds the request already there
        self.t_start = time.monotonic() - self.t0
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(self.wire)
        self.sock.setblocking(False)

    def on_readable(self) -> None:
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError as e:
            return self._end("crashed", f"{type(e).__name__}: {e}")
        self.t_last = time.monotonic()
        self.conn.receive_data(data)
        while not self.finished:
            try:
                ev = self.conn.next_event()
            except h11.RemoteProtocolError as e:
                return self._end("crashed", f"connection dropped: {e}")
            if ev is h11.NEED_DATA:
                if not data:  # EOF inside a response: the server went away
                    return self._end("crashed", "connection closed mid-response")
                return
            if isinstance(ev, h11.Response):
                self.status = ev.status_code
            elif isinstance(ev, h11.Data):
                self._buf += bytes(ev.data)
                if self.req.stream and self.status == 200:
                    self._lines()
            elif isinstance(ev, (h11.EndOfMessage, h11.ConnectionClosed)):
                return self._finish()

    def _lines(self) -> None:
        *lines, self._buf = self._buf.split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace").rstrip("\r")
            if not line.startswith("data: "):
                continue
            payload = line[6:]
            if payload.strip() == "[DONE]":
                self.done = True
                continue
            chunk = json.loads(payload)
            if "error" in chunk:
                self.error = _error_text(chunk)
                continue
            got = chunk.get("tokens") or []
            if got and self.t_first is None:
                self.t_first = time.monotonic() - self.t0
            self.tokens.extend(got)
            if chunk.get("stop"):
                self._final(chunk)

    def _final(self, body: dict) -> None:
        self.stop_type, self.truncated = body.get("stop_type"), body.get("truncated")
        self.predicted = body.get("tokens_predicted")

    def _finish(self) -> None:
        if self.status != 200:
            self.error = _error_text(self._buf.decode(errors="replace"))
        elif not self.req.stream:
            body = json.loads(self._buf or b"{}")
            self.tokens = list(body.get("tokens") or [])
            self._final(body)
            self.done = True
        self._end(_classify(self.req, self.error, self.stop_type, self.truncated, self.predicted), self.error)

    def _end(self, kind: str, error: str | None) -> None:
        self.kind, self.error, self.finished = kind, error, True
        if self.sock is not None:
            self.sock.close()

    def outcome(self) -> Outcome:
        return Outcome(self.req.slot, self.kind or "timeout", self.status, self.error, self.done, self.stop_type,
                       self.truncated, self.predicted, tuple(self.tokens), len(self.req.prompt), self.req.n_predict,
                       self.t_start, self.t_first, time.monotonic() - self.t0)


class Abandoned(Exception):
    """The caller's `abandon` check asked to give up on this exchange (a start not in lock-step)."""


def exchange(port: int, reqs: tuple[Request, ...], timeout: float,
             abandon: Callable[[], bool] | None = None) -> list[Outcome]:
    """Send `reqs` (all at once, then each after its start_ms) and collect their outcomes.
    `abandon` is asked after every wake-up; when it answers True the exchange raises Abandoned."""
    t0 = time.monotonic()
    pending: list[_Exchange] = []
    out: dict[int, Outcome] = {}
    pending = [_Exchange(port, r, t0) for r in reqs]
    sel = selectors.DefaultSelector()
    waiting = sorted(pending, key=lambda x: x.req.start_ms)
    active: list[_Exchange] = []
    try:
        while waiting or active:
            now = time.monotonic()
            while waiting and (now - t0) * 1000 >= waiting[0].req.start_ms:
                x = waiting.pop(0)
                try:
                    x.send()
                    sel.register(x.sock, selectors.EVENT_READ, x)
                    active.append(x)
                except OSError as e:
                    x._end("crashed", f"could not send: {e}")
            wait = 0.05
            if waiting:
                wait = min(wait, max(0.0, waiting[0].req.start_ms / 1000 - (time.monotonic() - t0)))
            for key, _ in sel.select(wait):
                key.data.on_readable()
            if abandon is not None and abandon():
                raise Abandoned()
            for x in [x for x in active if x.finished or time.monotonic() - x.t_last > timeout]:
                if not x.finished:
                    x._end("timeout", f"no data for {timeout:.0f} s")
                sel.unregister(x.sock)
                active.remove(x)
    finally:
        for x in active:
            x._end(x.kind or "timeout", x.error or "interrupted")
        sel.close()
    for x in pending:
        out[x.req.slot] = x.outcome()
    return [out[r.slot] for r in reqs]


def _error_text(body) -> str:
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except json.JSONDecodeError:
            return body.strip()[:300] or "empty error body"
    err = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(err, dict):
        return str(err.get("message", err))
    return str(err)


EVICT_RE = re.compile(r"patchkit-evict: slot=(\d+) cells=(\d+) off=(\d+)(?: others=([\d:,]*))?")
ERROR_ALL_RE = re.compile(r"Context size has been exceeded\. off = (\d+)")


def events_from_log(text: str) -> tuple[Event, ...]:
    out = []
    for line in text.splitlines():
        m = EVICT_RE.search(line)
        if m:
            others = tuple(tuple(int(x) for x in kv.split(":")) for kv in (m.group(4) or "").split(",") if kv)
            out.append(Event("evict", int(m.group(3)), int(m.group(1)), int(m.group(2)), others))
            continue
        m = ERROR_ALL_RE.search(line)
        if m:
            out.append(Event("error-all", int(m.group(1))))
    return tuple(out)


def _poll_slots(srv: Server, t0: float, stop: threading.Event, into: list[Sample]) -> None:
    # /slots is a task on the server's main loop: polling while the first requests are being
    # launched would interleave with them, so the first poll waits until they are running
    stop.wait(0.03)
    while not stop.is_set():
        try:
            data = srv.get("/slots").json()
            t = time.monotonic() - t0
            for s in data:
                into.append(Sample(t, int(s["id"]), int(s.get("n_prompt_tokens", 0) or 0),
                                   bool(s.get("is_processing"))))
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            pass
        stop.wait(0.02)


LAUNCH_RE = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) .*launch_slot_: id +(\d+) ")
# Requests released together must start generating in the same server step: the sizing
# arithmetic (and where in the batch the victim sits) assumes lock-step. The server's HTTP
# threads add jitter of up to tens of ms (~100 steps of the tiny model), so a start whose
# simultaneous requests were not launched in one pass of the server's task loop is abandoned
# and made again. Within one pass consecutive launches are 0.01-0.1 ms apart (ASan builds
# included); a step in between (the early requests' prompts) leaves a gap of >= 1 ms. So the
# test is the largest gap between consecutive launches, not first-to-last (8 launches in one
# pass of an ASan build span ~0.5 ms).
MAX_LAUNCH_SPREAD_MS = 0.5
MAX_OFFSET_ERROR_MS = 20.0  # later groups: drift from the intended offset (busy servers answer late)
# A start that misses is abandoned as soon as its first group has launched (one server start:
# ~60 ms, ~0.4 s for an ASan build), so starts are cheap. Measured on 2 cores: one start in
# three is in lock-step, one in five on an ASan build, with streaks of 15+ misses there. So the
# budget is time, not a count: keep starting for up to RETRY_BUDGET_S, then run once to the end.
ATTEMPTS = 400
RETRY_BUDGET_S = 30.0


def launch_times(log_text: str) -> dict[int, float]:
    """Slot id -> when the server launched its first task (ms, from the log's own clock)."""
    at: dict[int, float] = {}
    for line in log_text.splitlines():
        m = LAUNCH_RE.match(line)
        if m and int(m.group(5)) not in at:
            mins, secs, ms, us = (int(g) for g in m.groups()[:4])
            at[int(m.group(5))] = (mins * 60 + secs) * 1000 + ms + us / 1000
    return at


def largest_gap(times: list[float]) -> float:
    ts = sorted(times)
    return max((b - a for a, b in zip(ts, ts[1:])), default=0.0)


def launch_spread_ms(log_text: str, wl: Workload) -> float:
    """Largest gap between consecutive server-side launches of requests meant to start together,
    or, scaled to the same threshold, the largest drift of a later group from its intended offset."""
    at = launch_times(log_text)
    worst = 0.0
    first: dict[int, float] = {}
    for start in sorted({r.start_ms for r in wl.requests}):
        times = [at[r.slot] for r in wl.requests if r.start_ms == start and r.slot in at]
        if times:
            first[start] = min(times)
        worst = max(worst, largest_gap(times))
    if len(first) > 1:
        t0 = first[min(first)]
        drift = max(abs((t - t0) - (start - min(first))) for start, t in first.items())
        worst = max(worst, drift * MAX_LAUNCH_SPREAD_MS / MAX_OFFSET_ERROR_MS)
    return worst


class _FirstGroupWatch:
    """`abandon` for exchange(): True once every request of the first group has launched and two
    consecutive launches were more than MAX_LAUNCH_SPREAD_MS apart. Decides once, then stays quiet."""

    def __init__(self, log_path: Path, wl: Workload, patience: float = 1.0):
        start = min(r.start_ms for r in wl.requests)
        self.log_path, self.slots = log_path, {r.slot for r in wl.requests if r.start_ms == start}
        self.decided = len(self.slots) < 2
        self.deadline = time.monotonic() + patience

    def __call__(self) -> bool:
        if self.decided:
            return False
        if time.monotonic() > self.deadline:
            # a request of the group never launched (refused before a slot took it): stop
            # re-reading the log on every wake-up; run() judges the spread at the end
            self.decided = True
            return False
        at = launch_times(self.log_path.read_text(errors="replace"))
        if not self.slots <= at.keys():
            return False
        self.decided = True
        return largest_gap([at[s] for s in self.slots]) > MAX_LAUNCH_SPREAD_MS


def run(binary: Path, model: Path, wl: Workload, log_path: Path, *, draft: Path | None = None,
        timeout: float = 120.0, attempts: int = ATTEMPTS, budget_s: float = RETRY_BUDGET_S) -> Run:
    """Run on a fresh server; start again (up to `attempts` starts or `budget_s` seconds) while the
    start was not in lock-step. The last attempt is always run to the end, and its spread is
    recorded in the Run, so compare.py can say when no start was in lock-step."""
    deadline = time.monotonic() + budget_s
    for attempt in range(1, attempts + 1):
        last = attempt == attempts or time.monotonic() > deadline
        try:
            r = run_once(binary, model, wl, log_path, draft=draft, timeout=timeout, abandon_missed_start=not last)
        except Abandoned:
            continue
        spread = launch_spread_ms(Path(r.log).read_text(errors="replace"), wl)
        if spread <= MAX_LAUNCH_SPREAD_MS or last or r.exit_code is not None:
            return replace(r, attempts=attempt, launch_spread_ms=round(spread, 3))
    raise AssertionError("unreachable")


def run_once(binary: Path, model: Path, wl: Workload, log_path: Path, *, draft: Path | None = None,
             timeout: float = 120.0, abandon_missed_start: bool = False) -> Run:
    """A fresh server, every request, a follow-up probe, the server stopped."""
    args = wl.server.argv()
    if wl.server.draft:
        if draft is None:
            raise UsageError(f"workload {wl.name} needs a draft model.")
        args += ["-md", str(draft)]  # flag names of draft sizes changed across layouts: defaults
    log_path.write_text("")
    srv = Server(binary, model, args, log_path)
    with srv as ep:
        t0 = time.monotonic()
        samples: list[Sample] = []
        stop = threading.Event()
        poller = threading.Thread(target=_poll_slots, args=(srv, t0, stop, samples), daemon=True)
        poller.start()
        try:
            watch = _FirstGroupWatch(log_path, wl) if abandon_missed_start else None
            outcomes = exchange(ep.port, wl.requests, timeout, watch)
        finally:
            stop.set()
            poller.join(5)
        wall = time.monotonic() - t0
        alive = srv.healthy()  # alive AND answering: a killed server can still look alive for a moment
        followup_ok = False
        if alive:
            probe = Request(slot=wl.requests[0].slot, prompt=prompt_ids(8, 99), n_predict=8, stream=False)
            followup_ok = exchange(ep.port, (probe,), 60)[0].outcome == "completed"
        code = srv.returncode()
    text = log_path.read_text(errors="replace")
    return Run(wl.name, tuple(outcomes), tuple(samples), events_from_log(text), alive, followup_ok, code, wall,
               str(log_path), sanitizer=sanitizer_findings(text))
