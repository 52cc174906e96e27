"""Running a workload against a real llama-server: a fresh server per run, every request
released together, /slots polled, one Run recorded.

Releasing together, by construction: the tiny model samples a token every ~0.2 ms while the
server's HTTP threads add milliseconds of jitter (tens of ms on a loaded machine), so
requests written "at once" to a running server start generating many steps apart. So the
runner connects every socket of the first group (the server's HTTP threads accept them and
wait for bytes), then stops the whole server process (SIGSTOP), writes every request, and
resumes it (SIGCONT): all requests are already in their sockets when any server thread runs
again. Whatever start results is then MEASURED (measure.py), never assumed: verdicts are
judged on the measured facts. A start that did not have the workload's designed shape (e.g.
victim-first's victim entry already decoded when the pool filled) is made again while the
retry budget lasts. Every start that ran is kept (`Run.earlier`, each with its own log) and
judged by compare.py like the last one, sanitizer findings included: a start is made again
for its shape (measured on the policy's victim, never on the candidate's choice), never
dropped for its verdict.
"""
from __future__ import annotations

import functools
import logging
import os
import pickle
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import httpx

from . import cache, measure
from . import model as model_mod
from .errors import UsageError
from .exchange import exchange
from .record import (Run, Sample, events_from_log, largest_gap, last_request_ended, launch_times, metrics_from_text,
                     pool_cells, sanitizer_findings, trace_from_log)
from .server import Server
from .workload import Request, Workload, prompt_ids

# A start without the designed shape is made again for up to RETRY_BUDGET_S (at most ATTEMPTS
# starts), then the last one is judged as it is: on its measurements.
ATTEMPTS = 60
RETRY_BUDGET_S = 60.0
POLL_S = 0.005  # /slots between steps: one snapshot while requests generate aligns them (the fallback evidence)
_log = logging.getLogger("patchkit.run")


def _poll_slots(srv: Server, t0: float, stop: threading.Event, into: list[Sample]) -> None:
    while not stop.is_set():
        try:
            data = srv.get("/slots").json()
            if not isinstance(data, list):  # an error object: a server without /slots (A, unless --slots)
                raise ValueError(data)
            t = time.monotonic() - t0
            for s in data:
                nxt = s.get("next_token") or {}
                if isinstance(nxt, list):
                    nxt = nxt[0] if nxt else {}
                into.append(Sample(t, int(s["id"]), int(s.get("n_prompt_tokens", 0) or 0),
                                   bool(s.get("is_processing")), int(nxt.get("n_decoded", -1)),
                                   bool(s.get("is_parked"))))
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            pass
        stop.wait(POLL_S)


def launch_spread_ms(log_text: str, wl: Workload) -> float:
    """Largest gap between the server's launches of requests released together (informational)."""
    at = launch_times(log_text)
    return largest_gap([at[r.slot] for r in wl.first_group() if r.slot in at])


def _tokenized(srv: Server, r: Request) -> Request:
    """A real-text request, cut to its sized length in the served model's own tokens."""
    if not r.text:
        return r
    ids: list[int] = []
    while len(ids) < len(r.prompt):
        got = srv.post("/tokenize", {"content": r.text}).json()["tokens"]
        if not got:
            raise UsageError(f"request for slot {r.slot}: its text tokenizes to nothing.")
        ids += got
    return replace(r, prompt=tuple(ids[:len(r.prompt)]))


def run(binary: Path, model: Path, wl: Workload, log_path: Path, *, draft: Path | None = None,
        timeout: float = 120.0, attempts: int = ATTEMPTS, budget_s: float = RETRY_BUDGET_S,
        want_shape: bool = True, policy: str = "largest", probe_pool: bool = False,
        env: dict[str, str] | None = None, extra_args: tuple[str, ...] = (),
        say: Callable[[str], None] | None = None) -> Run:
    """Run on a fresh server; make the start again (budget permitting) while the measured run
    does not have the workload's designed shape for `policy`. The last run is returned with
    every earlier start in `earlier` (each keeps its log: `<log>.start<k>`), all judged.
    `want_shape=False` (the no-overflow control: nothing to shape) runs once. `probe_pool`: after
    the workload, one request sized to nearly the whole pool (Run.pool_probe). `env`, `extra_args`:
    added to the server's environment and command line (a candidate's own knobs and flags). `say`:
    told every 10 s of a wait on a silent server (`Waiting`)."""
    if not want_shape:
        attempts = 1
    # PATCHKIT_ATTEMPTS caps the starts (1: judge the first start as it is, e.g. to see what a
    # missed shape does to the verdict: INCONCLUSIVE, never FAIL)
    attempts = min(attempts, int(os.environ.get("PATCHKIT_ATTEMPTS", attempts)))
    deadline = time.monotonic() + budget_s
    earlier: list[Run] = []
    for attempt in range(1, attempts + 1):
        path = log_path if attempt == 1 else log_path.with_name(f"{log_path.name}.start{attempt}")
        r = run_once(binary, model, wl, path, draft=draft, timeout=timeout, probe_pool=probe_pool, env=env,
                     extra_args=extra_args, say=say)
        last = attempt == attempts or time.monotonic() > deadline
        kept = evidence(r)
        why = None if kept else measure.shape(r, wl, policy)
        _log.info("%s: start %d, %.2f s, log %.1f MB (%.2f MB at most while no request received anything)%s", wl.name,
                  attempt, r.wall, r.log_bytes / 2**20, r.log_quiet / 2**20,
                  f" (again: {why})" if why and not last else f" (kept as it is: {kept})" if kept else "")
        if last or why is None:
            return replace(r, attempts=attempt, earlier=tuple(earlier))
        earlier.append(replace(r, attempts=attempt))
    raise AssertionError("unreachable")


def evidence(r: Run) -> str:
    """Why a start is kept as it is, its shape reached or not ('' when it is not): a server that
    exited, or a request that timed out or crashed. Every check fails on these in any start (an
    earlier one through `earlier-starts`), so a start made again could not change the verdict: it
    would only wait out another hang (measured: a parked slot batched first, lora-resume-3, three
    starts of ~25 s each, all timeouts)."""
    if r.exit_code is not None:
        return f"the server exited with {r.exit_code}"
    lost = [o.slot for o in r.outcomes if o.outcome in ("timeout", "crashed")]
    return f"slot(s) {lost} timed out or crashed" if lost else ""


# A job that judges many candidates against one base (a test session, a CI matrix) measures each
# reference run once: with PATCHKIT_SHARED_RUNS naming a directory, a base or control run is kept
# there under what makes it the same measurement (the binary's identity, the model's, the workload
# as served, the policy its starts were shaped for, its index among the repeats, the start cap) and
# read back by every later comparison against that base, in any process of the job. The candidate's
# runs are never shared: they are what is judged. The mutation campaign does the same in-process.
SHARED_ENV = "PATCHKIT_SHARED_RUNS"


def _key(kind: str, binary: Path, model: Path, wl: Workload, index: int, policy: str, extra: object = None) -> str:
    stamps = [(str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in (Path(binary), Path(model))]
    return cache.digest(kind, stamps, repr(wl), index, policy, os.environ.get("PATCHKIT_ATTEMPTS"), extra)


def shared(kind: str, binary: Path, model: Path, wl: Workload, index: int, policy: str, make) -> tuple[Run, bool]:
    """(the run, whether it was read back): `make()` once per key while PATCHKIT_SHARED_RUNS is set."""
    where = os.environ.get(SHARED_ENV)
    if not where:
        return make(), False
    key = _key(kind, binary, model, wl, index, policy)
    path = Path(where) / f"{key}.pickle"
    try:
        r, kept = pickle.loads(path.read_bytes()), True
    except (OSError, EOFError, pickle.UnpicklingError):
        r, kept = make(), False
        path.parent.mkdir(parents=True, exist_ok=True)
        r = _logs_kept(r, Path(where), key)
        cache.write_atomic(path, pickle.dumps(r))
    _ledger(where, "read" if kept else "made", kind, wl, index, r, key)
    return r, kept


def _logs_kept(r: Run, where: Path, key: str) -> Run:
    """The run with its server log (and each earlier start's) kept beside its pickle too: every
    report that reads it back names a log that exists as long as the job's directory does, not one
    in the first comparison's directory (a test's, deleted when it passed), and that directory
    keeps its own logs as without sharing. A hard link (no second copy on one file system), else a
    copy."""
    def keep(run: Run, name: str) -> Run:
        dst = where / name
        try:
            try:
                os.link(run.log, dst)
            except OSError:
                shutil.copyfile(run.log, dst)
        except OSError:
            return run               # no log (nothing written): the run as made
        return replace(run, log=str(dst))
    return replace(keep(r, f"{key}.log"), earlier=tuple(keep(e, f"{key}.start{k + 1}.log")
                                                        for k, e in enumerate(r.earlier)))


def caught_up(log_path: Path, deadline_s: float = 10.0) -> bool:
    """Wait (at most `deadline_s`) until the server's log has written the end of the last request
    it launched, one whose client saw it complete: everything before it is then in the file (the
    logger writes in order). Measured in a cold clean-clone run: a base run's log lost its last
    50 KB (the overflow, the follow-up, the exit line) at the stop, and five tests failed on it."""
    end = time.monotonic() + deadline_s
    while True:
        done = last_request_ended(log_path.read_text(errors="replace"))
        if done is not False or time.monotonic() > end:
            return done is not False
        time.sleep(0.02)


def fresh_log(path: Path) -> None:
    """An empty log at `path`, a new file, not the old one emptied: an earlier run's log there may
    be kept (hard linked) in the job's shared directory (`_logs_kept`) and must keep its text."""
    path.unlink(missing_ok=True)
    path.write_text("")


def made(kind: str, binary: Path, model: Path, wl: Workload, index: int, policy: str, r: Run, extra: object) -> None:
    """A run that is never shared (a candidate's), written in the job's ledger under the key it would
    have (`extra`: what else sets it apart, the candidate's environment and flags): how often a job
    makes the very same candidate run is measured, not guessed."""
    where = os.environ.get(SHARED_ENV)
    if where:
        _ledger(where, "made", kind, wl, index, r, _key(kind, binary, model, wl, index, policy, extra))


def _ledger(where: str, use: str, kind: str, wl: Workload, index: int, r: Run, key: str) -> None:
    # one line per use (`ledger_summary` counts them): read or made, and how long
    Path(where).mkdir(parents=True, exist_ok=True)
    with open(Path(where) / "ledger", "a") as fh:
        fh.write(f"{use} {kind} {wl.name} {index} {r.wall:.3f} {key}\n")


def ledger_summary(where: str) -> str | None:
    """What a job shared, from its ledger (None: nothing written): reference runs made and read
    back, and candidate runs made, with how many repeated an earlier one's key exactly."""
    path = Path(where) / "ledger"
    if not where or not path.exists():
        return None
    uses = [line.split() for line in path.read_text().splitlines()]
    ref = [u for u in uses if u[1] != "candidate"]
    cand = [u for u in uses if u[1] == "candidate"]
    return (f"runs shared by this session: {sum(u[0] == 'made' for u in ref)} reference runs made, "
            f"{sum(u[0] == 'read' for u in ref)} read back; {len(cand)} candidate runs made, "
            f"{len(cand) - len({u[5] for u in cand})} of them the same key as an earlier one")


WAIT_SAID_S = 10.0   # how often a wait on a silent server is said


class Waiting:
    """Says every WAIT_SAID_S s how long no open request has received a byte (keep-alive
    pings are not bytes here: exchange._progress), up to the timeout that ends them: a run that
    waits its 30 s or more on a silent server says why it is slow instead of looking hung. As
    exchange's `flood` it never cuts anything (None)."""

    def __init__(self, say: Callable[[str], None], what: str, timeout: float) -> None:
        self.say, self.what, self.timeout, self.told = say, what, timeout, 0.0
        self.every = WAIT_SAID_S     # read when made: a test sets the module's constant, one knob

    def __call__(self, last: float) -> None:
        silent = (time.monotonic() - last) // self.every * self.every
        if self.told < silent < self.timeout:     # the timeout says itself: the request's reason
            self.say(f"  {self.what}: no byte from the server for {silent:.0f} s with a request open "
                     f"(timeout at {self.timeout:.0f} s)")
        self.told = silent


# A verbose log past this size while requests wait means the server loops without progress (a slot
# left processing that nothing advances: ~6 MB/s of "posting NEXT_RESPONSE", measured); a whole
# suite workload logs ~1-10 MB. The open requests end as timeouts, with the reason.
LOG_CAP = 128 << 20


def flooded(log_path: Path) -> str | None:
    try:
        size = log_path.stat().st_size
    except OSError:
        return None
    return (f"the server's log passed {LOG_CAP >> 20} MB while requests waited: the server loops "
            "without progress") if size > LOG_CAP else None


# The same loop, seen sooner: its log grows while no request receives anything. A right server
# logs a step's lines and a token reaches its client in the same step; between two receptions it
# logs a prefill's or a recompute's batches, or, for requests not streamed, the whole generation.
# Measured (`python bench/log_quiet.py`: every family's default suite on C2, base, control and
# candidate): at most 0.36-0.40 MB (overflow-nonstream: nothing received until the end), and no
# workload's whole log passes 4.1 MB (many-resumes-8). 16 MB is 4x any whole log: cut there, a
# hang costs a second or two of log, not 128 MB and its parse (each run's most is in its
# "start k" line and report.json's log_quiet_bytes).
QUIET_CAP = 16 << 20


class Flood:
    """exchange's `flood` for one run's log: the log's growth since any request last sent or
    received anything (`most`: the largest seen), cut past QUIET_CAP, or the whole log past LOG_CAP."""

    def __init__(self, log_path: Path) -> None:
        self.path, self.mark, self.base, self.most = log_path, None, 0, 0

    def __call__(self, progress: float) -> str | None:
        try:
            size = self.path.stat().st_size
        except OSError:
            return None
        if progress != self.mark:
            self.mark, self.base = progress, size
        quiet = size - self.base
        self.most = max(self.most, quiet)
        if quiet > QUIET_CAP:
            return (f"the server logged {quiet >> 20} MB while no request received anything: it loops "
                    "without progress")
        return flooded(self.path)


# The least a request may go without a byte before it counts as a hang: verify.idle_timeout's floor
# for a laboratory run (10x its control's wall above that), and the users' traffic's whole rule
# (its controls come after it: Stall)
IDLE_FLOOR_S = 30.0


class Stall:
    """A server that does nothing while requests wait: no token to any stream and no line of its
    verbose log but keep-alive pings for `quiet_s` seconds, with a request open. A verbose server
    logs every loop turn that has work (a step, a queued task, a parked slot polled), so its
    silence with a request open is a loop blocked for good (a deadlock). Its HTTP threads still
    ping each open stream (an SSE comment every 30 s, logged: measured on C2), which the clients'
    read timeouts never see pass, so nothing else would end the wait before the run's deadline."""

    KEEPALIVE = ("sending SSE ping", "http: streamed chunk: :")
    # more growth than this since the last look is a loop at work (a ping logs ~100 bytes per open
    # stream): counted without reading it, so a flooding log (~6 MB/s) costs no read here, and the
    # flood's own cut (Flood, which only stats the file) is not delayed by one (measured, the
    # never-resumed traffic, quiet: reading every byte, cut at 26 MB of quiet growth, 47 MB in all;
    # without, 17 and 28 MB, as before this class)
    READ_MAX = 4096

    def __init__(self, log_path: Path, quiet_s: float = IDLE_FLOOR_S) -> None:
        self.path, self.quiet_s, self.offset = log_path, quiet_s, 0
        self.mark, self.since = None, time.monotonic()

    def _logged(self) -> int:
        """The log's complete lines written since the last call that are not keep-alive pings (a
        line still being written is read once it is whole); 1 for a growth past READ_MAX, unread."""
        try:
            size = self.path.stat().st_size
            if size - self.offset > self.READ_MAX:
                self.offset = size
                return 1
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(size - self.offset)
        except OSError:
            return 0
        whole = data[:data.rfind(b"\n") + 1]
        self.offset += len(whole)
        return sum(1 for line in whole.decode(errors="replace").splitlines()
                   if line.strip() and not any(k in line for k in self.KEEPALIVE))

    def silent_for(self) -> float:
        """How long the server has been silent with a request waiting, as of the last call (0: not)."""
        return 0.0 if not (self.mark and self.mark[1]) else time.monotonic() - self.since

    def __call__(self, progress: float, waiting: int) -> str | None:
        now = time.monotonic()
        if self._logged() or (progress, waiting) != self.mark or not waiting:
            self.mark, self.since = (progress, waiting), now
            return None
        if now - self.since < self.quiet_s:
            return None
        return (f"the server sent no token and logged nothing but keep-alive pings for {now - self.since:.0f} s "
                f"while {waiting} request(s) waited: its loop is blocked")


# the pool probe leaves this many cells unused (its own 8 tokens and slack for the pool's padding)
PROBE_SLACK = 24


def run_once(binary: Path, model: Path, wl: Workload, log_path: Path, *, draft: Path | None = None,
             timeout: float = 120.0, probe_pool: bool = False, env: dict[str, str] | None = None,
             extra_args: tuple[str, ...] = (), say: Callable[[str], None] | None = None) -> Run:
    """A fresh server, every request, a follow-up probe, the server stopped. `say`: told while
    requests wait on a silent server (`Waiting`)."""
    # upstream's own per-step log (each slot's batch entry and cells, each token, retries, errors):
    # the exact record measure.py judges from, whatever the client's scheduling was
    # and its /metrics, read once after the workload: what an operator's scrape would see
    args = wl.server.argv() + ["--verbose", "--metrics"]
    if wl.server.draft:
        if draft is None:
            raise UsageError(f"workload {wl.name} needs a draft model.")
        args += ["-md", str(draft)]  # flag names of draft sizes changed across layouts: defaults
    if wl.server.lora:
        args += ["--lora", str(model_mod.lora(model))]  # each request names its scale (Request.lora)
    args += list(extra_args)
    fresh_log(log_path)
    srv = Server(binary, model, args, log_path, env=env)
    with srv as ep:
        if any(r.text for r in wl.requests):
            wl = replace(wl, requests=tuple(_tokenized(srv, r) for r in wl.requests))
        t0 = time.monotonic()
        samples: list[Sample] = []
        stop = threading.Event()
        poller = threading.Thread(target=_poll_slots, args=(srv, t0, stop, samples), daemon=True)

        def release(write_all) -> None:
            with srv.paused():
                write_all()
            if not poller.is_alive():  # after the first release: a /slots task among the launches would split them
                poller.start()

        what = log_path.name.replace(".log", "")     # overflow-4.candidate.0, ...candidate.0.start2
        try:
            flood = Flood(log_path)
            told = Waiting(say, what, timeout) if say else None
            outcomes = exchange(ep.port, wl.requests, timeout, release=release,
                                flood=(lambda last: told(last) or flood(last)) if told else flood)
        finally:
            stop.set()
            if poller.is_alive():
                poller.join(5)
        wall = time.monotonic() - t0
        alive = srv.healthy()  # alive AND answering: a killed server can still look alive for a moment
        followup_ok, answers, followup_why = False, alive, "not sent: the server was not answering /health"
        if alive:
            # the run's own idle rule: a loop blocked for good (its HTTP threads still answer /health)
            # is not waited on for a minute per probe, then 30 s for its /metrics
            probe = Request(slot=wl.requests[0].slot, prompt=prompt_ids(8, 99), n_predict=8, stream=False)
            followup = exchange(ep.port, (probe,), timeout,
                                flood=Waiting(say, f"{what} follow-up", timeout) if say else None)[0]
            followup_ok, answers = followup.outcome == "completed", followup.outcome != "timeout"
            followup_why = "" if followup_ok else f"{followup.outcome}: {followup.error or 'no error text'}"
        pool_probe = ""
        if answers and probe_pool:
            # every request has ended: a prompt of nearly the whole pool fits only if every cell came
            # back (idle slots' cached prompts are purged by the server on demand)
            big = Request(slot=wl.requests[0].slot, prompt=prompt_ids(wl.server.ctx - PROBE_SLACK, 98), n_predict=8,
                          stream=False)
            o = exchange(ep.port, (big,), 120)[0]
            pool_probe = "completed" if o.outcome == "completed" else f"{o.outcome}: {o.error or 'no error text'}"
        metrics = _scrape(srv) if answers else None
        code = srv.returncode()
        if followup_ok:
            caught_up(log_path)
    size, text = log_path.stat().st_size, log_path.read_text(errors="replace")
    return Run(wl.name, tuple(outcomes), tuple(samples), events_from_log(text), alive, code, wall,
               str(log_path), launch_spread_ms=round(launch_spread_ms(text, wl), 3),
               sanitizer=sanitizer_findings(text), pool=pool_cells(text, wl.server.ctx), trace=trace_from_log(text),
               pool_probe=pool_probe, sanitized=binary_sanitizers(binary), metrics=metrics,
               log_bytes=size, log_quiet=flood.most, followup=followup_why)


def _scrape(srv: Server) -> tuple[tuple[str, float], ...] | None:
    try:
        r = srv.get("/metrics", timeout=30.0)
    except httpx.HTTPError:
        return None
    return metrics_from_text(r.text) if r.status_code == 200 else None


# A runtime's entry symbol: present in a binary linked with -fsanitize=..., absent otherwise.
RUNTIMES = {"address": b"__asan_init", "undefined": b"__ubsan_handle_"}


def binary_sanitizers(binary: Path) -> tuple[str, ...]:
    """The sanitizer runtimes `binary` carries, measured from its bytes (not from how it was
    asked to be built): a `no-sanitizer-findings` pass means something only when one was there."""
    st = Path(binary).stat()
    return _runtimes(str(binary), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=32)
def _runtimes(path: str, mtime_ns: int, size: int) -> tuple[str, ...]:
    data = Path(path).read_bytes()
    return tuple(name for name, sym in RUNTIMES.items() if sym in data)

