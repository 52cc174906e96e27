"""The HTTP side of a run: each request on its own socket, its response parsed with h11
(sans-IO HTTP/1.1), every streamed token stamped with its arrival time. Recording never
raises: whatever a request experiences (HTTP error, in-band error, dropped stream, timeout)
becomes an `Outcome`.

Requests use h11 over raw sockets rather than an HTTP client library because the runner
must connect every socket first and then write every request back to back while the
server is paused (see runner.py): a client library hides exactly that split.
"""
from __future__ import annotations

import json
import selectors
import socket
import time
from typing import Callable

import h11

from .record import Outcome
from .workload import Request


# C2's output parser turns down what a real model said after some prompts: its own outcome, never
# to be mistaken for the KV error (the server sends both as in-band errors)
REJECTED = "does not match the expected"


def _classify(req: Request, error, stop_type, truncated, predicted) -> str:
    if error is not None:
        return "rejected" if REJECTED in error else "errored"
    if stop_type is None:
        return "crashed"  # the stream ended with neither a final chunk nor an error
    short = predicted is not None and predicted < req.n_predict and stop_type != "eos"
    return "truncated" if truncated or short else "completed"


def error_text(body) -> str:
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except json.JSONDecodeError:
            return body.strip()[:300] or "empty error body"
    err = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(err, dict):
        return str(err.get("message", err))
    return str(err)


def _progress(payload: bytes) -> bool:
    """Whether a piece of a response's body is the server's work, not its HTTP thread's keep-alive:
    upstream pings a silent stream with an empty SSE comment (":", every sse_ping_interval s, 30 by
    default on C2) whatever its loop does, so a loop blocked for good still sends bytes, and a
    request's idle clock counts only the rest (measured with pings every second against a 3 s
    timeout: counted as data, no request of a deadlocked eviction ever timed out)."""
    return any(line.strip() not in (b"", b":") for line in payload.split(b"\n"))


class Exchange:
    """One request on its own socket: `connect()`, then `write()`, then `on_readable()` until finished."""

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
        self.predicted_n = None
        self.has_content = False
        self.t_start = 0.0
        self.t_first = None
        self.t_end: float | None = None  # set when the exchange ends
        self.t_last = time.monotonic()
        self.done = False          # `data: [DONE]` (stream) or a whole 200 body (non-stream)
        self.finished = False      # the exchange is over, whatever happened
        self.kind: str | None = None
        self.tokens: list[int] = []
        self.token_t: list[float] = []
        self.notices: list[tuple[str, int]] = []  # SSE comment lines (": preempted"), with the tokens before each
        self._buf = b""
        self._sent = 0             # bytes of `wire` already sent (prime)

    def connect(self) -> None:
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def prime(self) -> None:
        """Connect and send all but the request's last byte: the server's HTTP thread holds it,
        unparsed, until that byte comes, so a later `write()` reaches the queue within one send
        (an `after` request's post then lags its trigger by the client's read alone)."""
        self.connect()
        self.sock.sendall(self.wire[:-1])
        self._sent = len(self.wire) - 1

    def write(self) -> None:
        if self.sock is None:
            self.connect()
        self.t_start = time.monotonic() - self.t0
        self.sock.sendall(self.wire[self._sent:])
        self.sock.setblocking(False)
        self.t_last = time.monotonic()

    def on_readable(self) -> None:
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError as e:
            return self.end("crashed", f"{type(e).__name__}: {e}")
        self.conn.receive_data(data)
        while not self.finished:
            try:
                ev = self.conn.next_event()
            except h11.RemoteProtocolError as e:
                return self.end("crashed", f"connection dropped: {e}")
            if ev is h11.NEED_DATA:
                if not data:  # EOF inside a response: the server went away
                    return self.end("crashed", "connection closed mid-response")
                return
            if isinstance(ev, h11.Response):
                self.status = ev.status_code
                self.t_last = time.monotonic()
            elif isinstance(ev, h11.Data):
                if _progress(bytes(ev.data)):
                    self.t_last = time.monotonic()
                self._buf += bytes(ev.data)
                if self.req.stream and self.status == 200:
                    self._lines()
            elif isinstance(ev, (h11.EndOfMessage, h11.ConnectionClosed)):
                return self._finish()

    def _lines(self) -> None:
        *lines, self._buf = self._buf.split(b"\n")
        now = time.monotonic() - self.t0
        for raw in lines:
            line = raw.decode(errors="replace").rstrip("\r")
            if line.startswith(":"):  # an SSE comment: a server that says it preempted / resumed the stream
                if line[1:].strip():  # (an empty one is a keep-alive ping: _progress)
                    self.notices.append((line[1:].strip(), len(self.tokens)))
                continue
            if not line.startswith("data: "):
                continue
            payload = line[6:]
            if payload.strip() == "[DONE]":
                self.done = True
                continue
            chunk = json.loads(payload)
            if "error" in chunk:
                self.error = error_text(chunk)
                continue
            if chunk.get("index", 0) != 0:
                # an n_cmpl request streams its completions interleaved, each chunk with its index:
                # the outcome is the first completion's, the one its pinned (parent) slot generates
                continue
            got = chunk.get("tokens") or []
            if got and self.t_first is None:
                self.t_first = now
            self.tokens.extend(got)
            self.token_t.extend([now] * len(got))
            if chunk.get("stop"):
                self._final(chunk)

    def _final(self, body: dict) -> None:
        self.stop_type, self.truncated = body.get("stop_type"), body.get("truncated")
        self.predicted = body.get("tokens_predicted")
        self.has_content = "content" in body
        timings = body.get("timings")
        self.predicted_n = timings.get("predicted_n") if isinstance(timings, dict) else None

    def _finish(self) -> None:
        if self.status != 200:
            self.error = error_text(self._buf.decode(errors="replace"))
        elif not self.req.stream:
            body = json.loads(self._buf or b"{}")
            self.tokens = list(body.get("tokens") or [])  # no per-token arrival times without a stream
            self._final(body)
            self.done = True
        self.end(_classify(self.req, self.error, self.stop_type, self.truncated, self.predicted), self.error)

    def end(self, kind: str, error: str | None) -> None:
        self.kind, self.error, self.finished = kind, error, True
        self.t_end = time.monotonic() - self.t0
        if self.sock is not None:
            self.sock.close()

    def outcome(self) -> Outcome:
        t_end = self.t_end if self.t_end is not None else time.monotonic() - self.t0
        return Outcome(self.req.slot, self.kind or "timeout", self.status, self.error, self.done, self.stop_type,
                       self.truncated, self.predicted, tuple(self.tokens), len(self.req.prompt), self.req.n_predict,
                       self.t_start, self.t_first, t_end, tuple(self.token_t), tuple(self.notices),
                       has_content=self.has_content, predicted_n=self.predicted_n)


class Abandoned(Exception):
    """The caller's `abandon` check asked to give up on this exchange."""


def exchange(port: int, reqs: tuple[Request, ...], timeout: float, *,
             release: Callable[[Callable[[], None]], None] | None = None,
             abandon: Callable[[], bool] | None = None,
             flood: Callable[[float], str | None] | None = None) -> list[Outcome]:
    """Send `reqs` and collect their outcomes. The requests that start first (smallest start_ms)
    are connected, then written together inside `release(write_all)` (the runner pauses the
    server around it); later ones are written at their start_ms, or once the request they follow
    (`after`) has streamed that many tokens: those are primed with the first group (all but
    their last byte sent), so the trigger costs one send. `abandon` is asked after
    every wake-up; when it answers True the exchange raises Abandoned. `flood` too, with the time any
    request last sent or received anything: when it gives a reason (the server spins without
    progress), every request still open ends as a timeout with it."""
    t0 = time.monotonic()
    pending = [Exchange(port, r, t0) for r in reqs]
    sel = selectors.DefaultSelector()
    first = min(r.start_ms for r in reqs if not r.after)
    together = [x for x in pending if x.req.start_ms == first and not x.req.after]
    waiting = sorted((x for x in pending if x.req.start_ms != first and not x.req.after), key=lambda x: x.req.start_ms)
    # sent when another request has streamed so many tokens (or ended): placed by the server's steps
    by_slot = {x.req.slot: x for x in pending}
    triggered = [x for x in pending if x.req.after]
    active: list[Exchange] = []

    def send(group: list[Exchange]) -> None:
        for x in group:
            if x.finished:
                continue
            try:
                x.write()
                sel.register(x.sock, selectors.EVENT_READ, x)
                active.append(x)
            except OSError as e:
                x.end("crashed", f"could not send: {e}")

    def start(group: list[Exchange]) -> None:
        for x in group:
            try:
                x.connect()
            except OSError as e:
                x.end("crashed", f"could not connect: {e}")

        def write_all() -> None:
            if group is together:
                for x in triggered:   # primed while the server is paused, with the first group
                    try:
                        x.prime()
                    except OSError as e:
                        x.end("crashed", f"could not connect: {e}")
            send(group)
        (release or (lambda f: f()))(write_all)

    try:
        start(together)
        t_rel = time.monotonic()
        while waiting or active or triggered:
            while waiting and (time.monotonic() - t_rel) * 1000 >= waiting[0].req.start_ms - first:
                start([waiting.pop(0)])
            for x in [x for x in triggered if by_slot[x.req.after[0]].finished
                      or len(by_slot[x.req.after[0]].tokens) >= x.req.after[1]]:
                triggered.remove(x)
                send([x])   # its last byte: no pause, the server reads it at once
            wait = 0.05
            if waiting:
                wait = min(wait, max(0.0, (waiting[0].req.start_ms - first) / 1000 - (time.monotonic() - t_rel)))
            for key, _ in sel.select(wait):
                key.data.on_readable()
            if abandon is not None and abandon():
                raise Abandoned()
            why = flood(max(x.t_last for x in pending)) if flood is not None and active else None
            if why:
                for x in active:
                    if not x.finished:
                        x.end("timeout", why)
            for x in [x for x in active if x.finished or time.monotonic() - x.t_last > timeout]:
                if not x.finished:
                    x.end("timeout", f"no data for {timeout:.0f} s")
                sel.unregister(x.sock)
                active.remove(x)
    finally:
        for x in active:
            if not x.finished:
                x.end(x.kind or "timeout", x.error or "interrupted")
        sel.close()
    out = {x.req.slot: x.outcome() for x in pending}
    return [out[r.slot] for r in reqs]
