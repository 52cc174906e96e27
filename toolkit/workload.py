"""Workloads: data files in fixtures/workloads/ -> requests against a real llama-server -> outcomes.

A workload is a TOML file: server flags, requests (slot, prompt token ids, n_predict,
stream, start offset) and the expectations that apply. Running one starts a fresh server,
fires every request from its own thread at its start offset, polls /slots for per-slot KV
occupancy, and records one `Outcome` per request. Recording never raises: whatever a
request experiences (HTTP error, in-band error, dropped stream, timeout) becomes data.
"""
from __future__ import annotations

import json
import re
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from .errors import UsageError
from .server import Server

WORKLOAD_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "workloads"
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
    base: str = "all-error"         # all-error | unchanged | single-error
    candidate: str = "one-victim"   # one-victim | unchanged | single-error
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


def _classify(req: Request, status, error, done, stop_type, truncated, predicted, n_tokens) -> str:
    if error is not None:
        return "errored"
    if stop_type is None:
        return "crashed"  # the stream ended with neither a final chunk nor an error
    if truncated or (stop_type == "limit" and predicted is not None and predicted < req.n_predict):
        return "truncated"
    if predicted is not None and predicted < req.n_predict and stop_type != "eos":
        return "truncated"
    return "completed"


def send(url: str, req: Request, t0: float | None, timeout: float, ready=None) -> Outcome:
    """One request; every failure mode is an Outcome, never an exception.

    `ready` (a callable) is called once the connection is open and before the request is
    sent: the runner uses it to release all requests at once. The tiny model generates a
    token in ~0.2 ms, so requests that leave even a few ms apart do not overlap at all.
    """
    status = error = stop_type = truncated = predicted = None
    t_first = None
    done = False
    tokens: list[int] = []
    t0 = time.monotonic() if t0 is None else t0
    start = 0.0
    try:
        with httpx.Client(timeout=httpx.Timeout(timeout, connect=10.0)) as client:
            client.get(url + "/health")  # open the keep-alive connection before the start line
            if ready:
                ready()
            start = time.monotonic() - t0
            if req.stream:
                with client.stream("POST", url + "/completion", json=req.body()) as resp:
                    status = resp.status_code
                    if status != 200:
                        resp.read()
                        error = _error_text(resp.text)
                    else:
                        for line in resp.iter_lines():
                            if not line.startswith("data: "):
                                continue
                            payload = line[6:]
                            if payload.strip() == "[DONE]":
                                done = True
                                continue
                            chunk = json.loads(payload)
                            if "error" in chunk:
                                error = _error_text(chunk)
                                continue
                            got = chunk.get("tokens") or []
                            if got and t_first is None:
                                t_first = time.monotonic() - t0
                            tokens.extend(got)
                            if chunk.get("stop"):
                                stop_type = chunk.get("stop_type")
                                truncated = chunk.get("truncated")
                                predicted = chunk.get("tokens_predicted")
            else:
                resp = client.post(url + "/completion", json=req.body())
                status = resp.status_code
                if status != 200:
                    error = _error_text(resp.text)
                else:
                    body = resp.json()
                    tokens = list(body.get("tokens") or [])
                    stop_type, truncated = body.get("stop_type"), body.get("truncated")
                    predicted = body.get("tokens_predicted")
                    done = True
        kind = _classify(req, status, error, done, stop_type, truncated, predicted, len(tokens))
    except httpx.TimeoutException:
        kind, error = "timeout", f"no answer within {timeout:.0f} s"
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as e:
        kind, error = "crashed", f"{type(e).__name__}: {e}"
    return Outcome(req.slot, kind, status, error, done, stop_type, truncated, predicted, tuple(tokens),
                   len(req.prompt), req.n_predict, start, t_first, time.monotonic() - t0)


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


def _poll_slots(url: str, t0: float, stop: threading.Event, into: list[Sample]) -> None:
    with httpx.Client(timeout=2.0) as client:
        while not stop.is_set():
            try:
                data = client.get(url + "/slots").json()
                t = time.monotonic() - t0
                for s in data:
                    into.append(Sample(t, int(s["id"]), int(s.get("n_prompt_tokens", 0) or 0),
                                       bool(s.get("is_processing"))))
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                pass
            stop.wait(0.02)


def run(binary: Path, model: Path, wl: Workload, log_path: Path, *, draft: Path | None = None,
        timeout: float = 120.0) -> Run:
    """A fresh server, every request, a follow-up probe, the server stopped."""
    args = wl.server.argv()
    if wl.server.draft:
        if draft is None:
            raise UsageError(f"workload {wl.name} needs a draft model.")
        args += ["-md", str(draft), "--draft-max", "4", "--draft-min", "1"]
    log_path.write_text("")
    srv = Server(binary, model, args, log_path)
    with srv as ep:
        t0 = time.monotonic()
        samples: list[Sample] = []
        stop = threading.Event()
        poller = threading.Thread(target=_poll_slots, args=(ep.url, t0, stop, samples), daemon=True)
        poller.start()
        results: dict[int, Outcome] = {}
        barrier = threading.Barrier(len(wl.requests))
        start_line: list[float] = []

        def worker(req: Request) -> None:
            def ready() -> float:
                try:
                    if barrier.wait(timeout=30) == 0:
                        start_line.append(time.monotonic())
                except threading.BrokenBarrierError:
                    pass
                while not start_line:
                    time.sleep(0.0005)
                delay = req.start_ms / 1000 - (time.monotonic() - start_line[0])
                if delay > 0:
                    time.sleep(delay)

            results[req.slot] = send(ep.url, req, t0, timeout, ready)

        threads = [threading.Thread(target=worker, args=(r,), daemon=True) for r in wl.requests]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout + 30)
        stop.set()
        poller.join(5)
        wall = time.monotonic() - t0
        alive = srv.alive()
        followup_ok = False
        if alive:
            probe = Request(slot=wl.requests[0].slot, prompt=prompt_ids(8, 99), n_predict=8, stream=False)
            followup_ok = send(ep.url, probe, t0, 60).outcome == "completed"
        code = srv.returncode()
    text = log_path.read_text(errors="replace")
    outcomes = tuple(results.get(r.slot) or Outcome(r.slot, "timeout", None, "worker did not finish", False,
                                                    None, None, None, (), len(r.prompt), r.n_predict, 0, None, wall)
                     for r in wl.requests)
    return Run(wl.name, outcomes, tuple(samples), events_from_log(text), alive, followup_ok, code, wall,
               str(log_path))
