"""What a workload run leaves behind: per-request outcomes (with every token's arrival time),
/slots snapshots, the server log's witnesses. Plain data, no processes; built by runner.py,
read by measure.py and compare.py."""
from __future__ import annotations

import re
from dataclasses import dataclass

OUTCOMES = ("completed", "errored", "rejected", "truncated", "crashed", "timeout")


@dataclass(frozen=True)
class Outcome:
    slot: int
    outcome: str               # one of OUTCOMES (rejected: the server's output parser refused the text)
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
    t_end: float               # when the exchange ended: for an errored stream, when the error arrived
    token_t: tuple[float, ...] = ()  # arrival time of each token (seconds since t0), same length as tokens
    # SSE comment lines the server sent in the stream (e.g. "preempted", "resumed"), each with the
    # number of tokens received before it
    notices: tuple[tuple[str, int], ...] = ()
    # what llama.cpp's own server tests read from the final body (upstream_unified.py applies their
    # rule): whether it has "content", and its timings.predicted_n (None: the body had no timings)
    has_content: bool = False
    predicted_n: int | None = None


@dataclass(frozen=True)
class Sample:
    """One slot in one /slots snapshot. The server answers /slots between two decode steps, so
    the slots of one snapshot (same t) are seen at the same step: `generated` is exact there."""
    t: float
    slot: int
    cells: int                 # n_prompt_tokens as /slots reports it (informational)
    processing: bool
    generated: int = -1        # next_token.n_decoded: tokens sampled so far (-1: not reported)
    parked: bool = False       # is_parked: a preemption family's parked slot (upstream has no such field)


@dataclass(frozen=True)
class Event:
    """One overflow event a witness logged: the patch's `patchkit-evict:` line (evict) or the
    server's own "Context size has been exceeded." error line (error-all)."""
    kind: str                  # "evict" | "error-all"
    off: int
    victim: int | None = None
    cells: int | None = None
    others: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Trace:
    """One line of upstream llama-server's own verbose log (`--verbose`), in log order. Upstream's
    code, not the patch's: per step, each generating slot's batch entry and the cells it held
    ("slot decode token ... n_tokens"), each sampled token ("n_gen ... next token"), the decode
    retries with their offset, errors sent, releases, launches."""
    kind: str        # step | entry | token | batch | retry | error | release | launch | post | loop | restore | chunk
    slot: int = -1
    task: int = -1
    value: int = 0   # entry: cells held; token: n_gen; batch: entries; retry: off; release: n_tokens; restore: cells;
    #                  chunk: cells held as its next prompt chunk joins the batch
    token: int = -1  # entry / token: the token id; retry: n_batch
    text: str = ""   # error: the message


@dataclass(frozen=True)
class Run:
    workload: str
    outcomes: tuple[Outcome, ...]
    samples: tuple[Sample, ...]
    events: tuple[Event, ...]  # the logs' testimony: a second witness, never the measurement
    alive_after: bool
    exit_code: int | None      # the server's, if it died during the run
    wall: float
    log: str
    attempts: int = 1          # starts made for this run (re-made while the start was not as sized)
    launch_spread_ms: float = 0.0  # largest gap between launches meant to be together (server log)
    sanitizer: tuple[str, ...] = ()  # AddressSanitizer / UBSan findings in the server log
    pool: int = 0              # KV cells the unified pool holds (the server's -c)
    trace: tuple[Trace, ...] = ()  # upstream's verbose log, parsed (empty when the server printed none)
    # the starts made before this one (without the workload's designed shape): judged too, never dropped
    earlier: tuple["Run", ...] = ()
    # after the workload, one request sized to nearly the whole pool (runner's `probe_pool`): "" not
    # made, "completed", or what went wrong. Completing shows every cell came back to the pool.
    pool_probe: str = ""
    # the sanitizer runtimes the server binary carries (runner.binary_sanitizers: measured from it)
    sanitized: tuple[str, ...] = ()
    # /metrics after the workload and its probes, (name, value) per unlabelled sample; None: not read
    # (the server was not answering)
    metrics: tuple[tuple[str, float], ...] | None = None
    # the server's log: its size, and the most it grew while no request received anything
    # (runner.Flood: a server looping without progress is cut by that)
    log_bytes: int = 0
    log_quiet: int = 0
    # why the follow-up request did not complete ("" when it did): its outcome and error, or why it
    # was not sent (the server was not answering)
    followup: str = ""

    @property
    def followup_ok(self) -> bool:
        """The request sent after the workload completed: no reason it did not (`followup`)."""
        return not self.followup

    def metric(self, name: str) -> float | None:
        return dict(self.metrics or ()).get(name)


def metrics_from_text(text: str) -> tuple[tuple[str, float], ...]:
    """The Prometheus text's unlabelled samples ("name value" lines; comments and labelled series
    left out)."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and not line.startswith("#") and "{" not in parts[0]:
            try:
                out.append((parts[0], float(parts[1])))
            except ValueError:
                continue
    return tuple(out)


SANITIZER_RE = re.compile(r"(ERROR: AddressSanitizer.*|runtime error: .*|ERROR: LeakSanitizer.*|"
                          r"WARNING: ThreadSanitizer.*)")


def sanitizer_findings(log_text: str) -> tuple[str, ...]:
    return tuple(m.group(1).strip()[:300] for m in SANITIZER_RE.finditer(log_text))


# the eviction patch's one operator-facing line (patches/evict-largest-slot/helper.cpp.j2)
EVICT_RE = re.compile(r"KV cache is full: terminating slot (\d+) \((\d+) cells[^)]*\) so that \d+ other slots? "
                      r"can continue, off = (\d+)")
ERROR_ALL_RE = re.compile(r"Context size has been exceeded\. off = (\d+)")


def events_from_log(text: str) -> tuple[Event, ...]:
    out = []
    for line in text.splitlines():
        m = EVICT_RE.search(line)
        if m:
            out.append(Event("evict", int(m.group(3)), int(m.group(1)), int(m.group(2)), ()))
            continue
        m = ERROR_ALL_RE.search(line)
        if m:
            out.append(Event("error-all", int(m.group(1))))
    return tuple(out)


LAUNCH_RE = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) .*launch_slot_: id +(\d+) ")


def launch_times(log_text: str) -> dict[int, float]:
    """Slot id -> when the server launched its first task (ms, from the log's own clock)."""
    at: dict[int, float] = {}
    for line in log_text.splitlines():
        m = LAUNCH_RE.match(line)
        if m and int(m.group(5)) not in at:
            mins, secs, ms, us = (int(g) for g in m.groups()[:4])
            at[int(m.group(5))] = (mins * 60 + secs) * 1000 + ms + us / 1000
    return at


POOL_RE = re.compile(r"llama_kv_cache: size = +[\d.]+ \w+ \( *(\d+) cells|"
                     r"llama_kv_cache_iswa: creating non-SWA KV cache, size = (\d+) cells")


def pool_cells(log_text: str, ctx: int) -> int:
    """The unified pool's cells as the server built it (llama.cpp pads -c, e.g. 278 -> 512); the
    first KV cache the log names is the full-attention one (iSWA names it first too)."""
    m = POOL_RE.search(log_text)
    if m:
        return int(m.group(1) or m.group(2))
    return -(-ctx // 256) * 256


def largest_gap(times: list[float]) -> float:
    ts = sorted(times)
    return max((b - a for a, b in zip(ts, ts[1:])), default=0.0)


_SLOT = r"id +(\d+) \| task (-?\d+) \| "
TRACE_RES = (
    ("step", re.compile(r"update_slots: posting NEXT_RESPONSE")),
    ("entry", re.compile(_SLOT + r"slot decode token, id=(-?\d+), n_ctx = \d+, n_tokens = (\d+)")),
    # "n_gen" from C2 on; "n_decoded" on A to C (the same count: tokens sampled so far)
    ("token", re.compile(_SLOT + r"(?:n_gen|n_decoded) = (\d+), n_remaining = -?\d+, next token: +(-?\d+) ")),
    ("retry", re.compile(r"retrying with smaller batch size, (?:off|i) = (\d+), n_batch = (\d+)")),
    ("batch", re.compile(r"failed to find a memory slot for batch of size (\d+)")),
    ("error", re.compile(r"send_error: task id = (-?\d+), error: (.*)$")),
    ("release", re.compile(_SLOT + r"stop processing: n_tokens = (\d+)")),
    ("launch", re.compile(_SLOT + r"processing task")),
    # a slot in its prompt, as the loop adds its next chunk to the step's batch: the cells it holds
    # then ("memory_seq_rm [p0, end)" from B on, "kv cache rm [p0, end)" on A). Several slots in
    # their prompt at a failing step are measured from these (overflows._chunked)
    ("chunk", re.compile(_SLOT + r"(?:cached n_tokens = \d+, memory_seq_rm|kv cache rm) \[(\d+), end\)")),
    # a task the HTTP thread handed to the server's queue (upstream's queue, "new task, id = 7/1"):
    # when a request arrived, in the loop's order. The loop's own NEXT_RESPONSE tasks log it too;
    # a request's is the one whose id a launch names
    ("post", re.compile(r"post: new task, id = (\d+)")),
    # the server's loop takes queued tasks (an HTTP cancel among them) only here, between two
    # update_slots calls: while decoding it declines them ("decoding, decline task")
    ("loop", re.compile(r"start_loop: processing new tasks")),
    # llama.cpp's KV cache reading a sequence back from a saved state (llama_state_seq_set_data):
    # a parked slot swapped back in, in the library's words, not the patch's
    ("restore", re.compile(r"state_read_meta: cell_count = (\d+), dest_seq_id = (-?\d+)")),
    # the server's last words on a stop: a log without them ended early (serverlog.log_truncated)
    ("exit", re.compile(r"cleaning up before exit")),
)


_LAUNCH_LINE = re.compile(_SLOT + r"processing task")


def last_request_ended(text: str) -> bool | None:
    """Has upstream's log written the end (its slot's "stop processing") of the last request the
    server launched? None: the log names no launch (a layout or a run without the verbose lines).
    The server's logger writes from a queue on its own thread and is never flushed at exit
    (upstream leaks it on purpose, common/log.cpp), so a log read after a stop on a loaded machine
    can miss its last ~50 KB; a run waits for this line before it stops the server."""
    at = text.rfind("| processing task")   # a slot's launch, not the queue's "processing task, id = 7"
    if at < 0:
        return None
    m = _LAUNCH_LINE.search(text, text.rfind("\n", 0, at) + 1)
    if m is None:
        return None
    return re.search(rf"\| task {m[2]} \| stop processing", text[m.end():]) is not None


# a cheap substring test first: a verbose log has ~11,000 lines per run, a few hundred of them ours
_TRACE_HINTS = ("NEXT_RESPONSE", "decode token", "n_gen = ", "n_decoded = ", "retrying", "memory slot", "send_error",
                "stop processing", "processing task", "start_loop: processing", "state_read_meta",
                "cleaning up before exit", "new task, id", ", end)")


def trace_from_log(text: str) -> tuple[Trace, ...]:
    out = []
    for line in text.splitlines():
        if not any(h in line for h in _TRACE_HINTS):
            continue
        for kind, rx in TRACE_RES:
            m = rx.search(line)
            if not m:
                continue
            g = m.groups()
            if kind == "step":
                out.append(Trace("step"))
            elif kind == "entry":
                out.append(Trace("entry", int(g[0]), int(g[1]), int(g[3]), int(g[2])))
            elif kind == "token":
                out.append(Trace("token", int(g[0]), int(g[1]), int(g[2]), int(g[3])))
            elif kind == "batch":
                out.append(Trace("batch", value=int(g[0])))
            elif kind == "retry":
                out.append(Trace("retry", value=int(g[0]), token=int(g[1])))
            elif kind == "error":
                out.append(Trace("error", task=int(g[0]), text=g[1].strip()))
            elif kind == "release":
                out.append(Trace("release", int(g[0]), int(g[1]), int(g[2])))
            elif kind == "loop":
                out.append(Trace("loop"))
            elif kind == "restore":
                out.append(Trace("restore", slot=int(g[1]), value=int(g[0])))
            elif kind == "exit":
                out.append(Trace("exit"))
            elif kind == "post":
                out.append(Trace("post", task=int(g[0])))
            elif kind == "chunk":
                out.append(Trace("chunk", int(g[0]), int(g[1]), int(g[2])))
            else:
                out.append(Trace("launch", int(g[0]), int(g[1])))
            break
    # a request's post only: the loop's own NEXT_RESPONSE tasks (one per step) and an HTTP cancel
    # are handed over the same way, and no launch names them
    launched = {t.task for t in out if t.kind == "launch"}
    return tuple(t for t in out if t.kind != "post" or t.task in launched)
