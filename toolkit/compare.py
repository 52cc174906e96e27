"""Expectations and oracles: pure functions from recorded runs to verdicts. No processes.

Vocabulary is closed: every Check is "pass" or "fail" (or "skip" with a reason, e.g. the
integrity oracle when there is no control run).
"""
from __future__ import annotations

from dataclasses import dataclass

from .workload import MAX_LAUNCH_SPREAD_MS, Event, Run, Workload

EXCEEDED = "Context size has been exceeded."


@dataclass(frozen=True)
class Check:
    name: str
    status: str   # pass | fail | skip
    detail: str

    @property
    def ok(self) -> bool:
        return self.status != "fail"


@dataclass(frozen=True)
class Verdict:
    workload: str
    side: str      # base | candidate
    run_index: int
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def _check(name: str, cond: bool, detail: str) -> Check:
    return Check(name, "pass" if cond else "fail", detail)


def _slots(outs, kind: str) -> list[int]:
    return [o.slot for o in outs if o.outcome == kind]


def server_checks(run: Run) -> list[Check]:
    return [
        _check("no-crash", run.exit_code is None and run.alive_after,
               "server alive after the workload" if run.alive_after
               else f"server died (exit code {run.exit_code})"),
        _check("serves-after", run.followup_ok, "a request sent afterwards completed" if run.followup_ok
               else "a request sent afterwards did not complete"),
        _check("no-sanitizer-findings", not run.sanitizer,
               "no AddressSanitizer/UBSan report in the server log" if not run.sanitizer
               else f"{len(run.sanitizer)} finding(s), first: {run.sanitizer[0]}"),
    ]


def lock_step(run: Run) -> Check:
    """The sizing arithmetic holds only if requests meant to start together did (workload.run
    starts the server again until they do; this says when no start managed it)."""
    if run.launch_spread_ms <= MAX_LAUNCH_SPREAD_MS:
        return Check("lock-step", "pass", f"launched in one server pass: largest gap {run.launch_spread_ms} ms "
                     f"(attempt {run.attempts})")
    return Check("lock-step", "fail",
                 f"no start in lock-step in {run.attempts} attempts (last: launches {run.launch_spread_ms} ms apart > "
                 f"{MAX_LAUNCH_SPREAD_MS} ms): this run is not the workload as sized, so its outcomes prove "
                 "nothing; the machine is probably overloaded, run again")


def all_error(run: Run) -> list[Check]:
    """The bug: every processing slot got the context error."""
    errored = [o for o in run.outcomes if o.outcome == "errored" and o.error == EXCEEDED]
    n = len(run.outcomes)
    return [_check("all-slots-errored", len(errored) == n,
                   f"{len(errored)}/{n} slots got '{EXCEEDED}'")] + server_checks(run)


def unchanged(run: Run) -> list[Check]:
    done = _slots(run.outcomes, "completed")
    return [_check("all-completed", len(done) == len(run.outcomes),
                   f"{len(done)}/{len(run.outcomes)} completed")] + server_checks(run)


def expected_victim(ev: Event, policy: str, wl: Workload) -> set[int]:
    cells = dict(ev.others)
    if ev.victim is not None and ev.cells is not None:
        cells[ev.victim] = ev.cells
    if not cells:
        return set()
    if policy == "largest":
        best = max(cells.values())
    elif policy == "smallest":
        best = min(cells.values())
    else:  # newest: the request that arrived last among those in play
        starts = {r.slot: r.start_ms for r in wl.requests if r.slot in cells}
        last = max(starts.values())
        return {s for s, t in starts.items() if t == last}
    return {s for s, c in cells.items() if c == best}


def one_victim(run: Run, wl: Workload, policy: str = "largest") -> list[Check]:
    evictions = [e for e in run.events if e.kind == "evict"]
    errored = [o for o in run.outcomes if o.outcome == "errored"]
    survivors = [o for o in run.outcomes if o.outcome != "errored"]
    checks = [
        _check("evictions-logged", len(evictions) >= 1 and not any(e.kind == "error-all" for e in run.events),
               f"{len(evictions)} eviction(s) at off = {[e.off for e in evictions]}"
               + ("; also an error-all event" if any(e.kind == "error-all" for e in run.events) else "")),
        _check("one-victim-per-event", len(errored) == len(evictions) and
               sorted(o.slot for o in errored) == sorted(e.victim for e in evictions),
               f"errored slots {[o.slot for o in errored]}, evicted {[e.victim for e in evictions]}"),
        _check("victim-error-text", all(o.error == EXCEEDED for o in errored),
               f"victims got {sorted({o.error for o in errored}) or 'nothing'}"),
    ]
    wrong = [(e.victim, sorted(expected_victim(e, policy, wl))) for e in evictions
             if e.victim not in expected_victim(e, policy, wl)]
    checks.append(_check(f"victim-is-{policy}", not wrong and bool(evictions),
                         "; ".join(f"slot {e.victim} held {e.cells} cells (others {dict(e.others)})"
                                   for e in evictions) + (f"; expected {wrong}" if wrong else "")))
    if wl.expect.victim is not None:
        checks.append(_check("victim-as-sized", [o.slot for o in errored] == [wl.expect.victim],
                             f"arithmetic says slot {wl.expect.victim}, got {[o.slot for o in errored]}"))
    short = [(o.slot, o.outcome, len(o.tokens)) for o in survivors
             if o.outcome != "completed" or len(o.tokens) != o.n_predict]
    checks.append(_check("survivors-complete", not short and bool(survivors),
                         f"{len(survivors)} survivors got all their tokens" if not short
                         else f"incomplete survivors (slot, outcome, tokens): {short}"))
    return checks + server_checks(run)


def integrity(run: Run, control: Run) -> list[Check]:
    """Survivors' token streams equal the control's; a victim's stream is a prefix of it."""
    ctl = {o.slot: o for o in control.outcomes}
    problems = []
    for o in run.outcomes:
        ref = ctl.get(o.slot)
        if ref is None or ref.outcome != "completed":
            problems.append(f"slot {o.slot}: control did not complete")
            continue
        pos = first_difference(o.tokens, ref.tokens)
        if o.outcome == "errored":
            if pos is not None and pos < len(o.tokens):
                problems.append(f"slot {o.slot} (victim): differs from control at token {pos}")
        elif pos is not None:
            problems.append(f"slot {o.slot}: differs from control at token {pos}")
    return [_check("integrity", not problems,
                   "survivors equal the control token for token; victims are prefixes" if not problems
                   else "; ".join(problems))]


def first_difference(a, b) -> int | None:
    """First index where a and b differ; len of the shorter if one is a prefix; None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def same_as(run: Run, base: Run | None) -> list[Check]:
    """The patch must not change anything: same outcome, same tokens, slot by slot."""
    if base is None:
        return [Check("same-as-base", "skip", "no base run to compare with")]
    ref = {o.slot: o for o in base.outcomes}
    diffs = []
    for o in run.outcomes:
        b = ref.get(o.slot)
        if b is None or (o.outcome, o.error, o.tokens) != (b.outcome, b.error, b.tokens):
            pos = first_difference(o.tokens, b.tokens) if b else None
            diffs.append(f"slot {o.slot}: {b.outcome if b else '-'} -> {o.outcome}"
                         + (f", tokens differ at {pos}" if pos is not None else ""))
    return [_check("same-as-base", not diffs, "every slot's outcome and tokens equal the base run" if not diffs
                   else "; ".join(diffs))]


def judge(wl: Workload, side: str, run: Run, index: int = 0, control: Run | None = None,
          policy: str = "largest", base: Run | None = None) -> Verdict:
    mode = wl.expect.base if side == "base" else wl.expect.candidate
    if mode == "same":
        checks = server_checks(run) + (same_as(run, base) if side == "candidate" else [])
    elif mode == "all-error":
        checks = all_error(run)
    elif mode == "unchanged":
        checks = unchanged(run)
    elif mode == "one-victim":
        checks = one_victim(run, wl, policy)
    else:
        raise ValueError(f"unknown expectation '{mode}' in workload {wl.name}")
    if side == "candidate" and wl.expect.integrity:
        checks += integrity(run, control) if control else [Check("integrity", "skip", "no control run")]
    return Verdict(wl.name, side, index, (lock_step(run), *checks))


@dataclass(frozen=True)
class Goodput:
    tokens: int
    completed: int
    requests: int


def goodput(runs: list[Run]) -> Goodput | None:
    if not runs:
        return None
    outs = [o for r in runs for o in r.outcomes]
    return Goodput(sum(len(o.tokens) for o in outs), sum(o.outcome == "completed" for o in outs), len(outs))
