"""Expectations and oracles: pure functions from measured runs to verdicts. No processes.

Every check reads a `measure.Measured` (a run measured once) and never measures itself; the
before-side, control and base runs it compares with are plain records (their outcomes and streams).

Vocabulary is closed: every Check is "pass" or "fail" (evidence against the patch, quoted), "skip"
with a reason (e.g. the integrity oracle when there is no control run), or "inconclusive" (a shape
not reached, evidence missing: never against the patch).
"""
from __future__ import annotations

from dataclasses import dataclass

from .measure import EXCEEDED, Measured, Overflow, Pause
from .record import Run
from .workload import Workload


@dataclass(frozen=True)
class Check:
    name: str
    status: str   # pass | fail | skip | inconclusive (a shape not reached, evidence missing: not against the patch)
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


def _reached(name: str, cond: bool, detail: str) -> Check:
    """A check of what the run reached, not of what the patch did: missing it is no evidence."""
    return Check(name, "pass" if cond else "inconclusive", detail)


def _slots(outs, kind: str) -> list[int]:
    return [o.slot for o in outs if o.outcome == kind]


def server_checks(m: Measured) -> list[Check]:
    run, problems = m.run, m.trace_problems
    return [
        Check("log-matches-streams", "inconclusive", "the server's log ends before the run did (every slot's "
              "logged tokens a prefix of its stream): measured from the client's records, and what only the log "
              "shows is not judged") if m.log_truncated else
        Check("log-matches-streams", "skip" if not run.trace else "fail" if problems else "pass",
              "the server printed no verbose log; measured from the client's records" if not run.trace
              else "; ".join(problems) if problems else
              "upstream's log lists exactly the tokens each client received: the measurement reads this run"),
        sampling(m),
        _check("no-crash", run.exit_code is None and run.alive_after,
               "server alive after the workload" if run.alive_after
               else f"server died (exit code {run.exit_code})"),
        _check("serves-after", run.followup_ok, "a request sent afterwards completed" if run.followup_ok
               else "a request sent afterwards did not complete" + (f" ({run.followup})" if run.followup else "")),
        Check("no-sanitizer-findings", "fail" if run.sanitizer else "pass" if run.sanitized else "skip",
              f"{len(run.sanitizer)} finding(s), first: {run.sanitizer[0]}" if run.sanitizer else
              f"no report in the server log of a binary carrying {' and '.join(run.sanitized)} (measured from "
              "the binary)" if run.sanitized else
              "the binary carries no sanitizer runtime (measured from the binary): nothing could report"),
    ]


def sampling(m: Measured) -> Check:
    """One sample per decoded entry, each slot decoding what it sampled (upstream's log)."""
    if not m.run.trace:
        return Check("one-sample-per-entry", "skip", "the server printed no verbose log")
    problems, unjudged = m.sampling_problems, list(m.sampling_unjudged)
    if problems:
        return Check("one-sample-per-entry", "fail", "; ".join(problems))
    if unjudged and not m.wl.server.draft:
        # fewer decode lines than samples with no draft model: the evidence is missing (a reworded
        # upstream log), which neither passes nor fails the patch
        return Check("one-sample-per-entry", "inconclusive", f"slots {unjudged} sampled tokens the log shows no "
                     "'slot decode token' entry for (no speculative decoding here): upstream's log may word it "
                     "otherwise now; nothing to judge")
    return Check("one-sample-per-entry", "pass", "every slot decoded exactly the tokens it sampled, one entry per "
                 "sample" + (f" (not judged: slots {unjudged}, several tokens per entry: speculative decoding)"
                             if unjudged else ""))


def start_shape(m: Measured) -> Check:
    """What the start measured to be (informational: verdicts never rest on it; runner.py only
    re-makes a start without the designed shape while its budget lasts)."""
    run, wl, offs = m.run, m.wl, m.offsets
    moved = {s: d.steps for s, d in offs.items() if d.steps}
    how = sorted({d.source for d in offs.values()}) or ["one request"]
    why = m.shape_miss
    detail = (f"requests released together started generating in the same step (measured from {', '.join(how)})"
              if not moved else "; ".join(  # steps > 0: it had sampled more at the same step, so it started first
                  f"slot {s} started generating {abs(n)} step{'s' if abs(n) != 1 else ''} {'before' if n > 0 else 'after'} "
                  f"slot {min(wl.requests, key=lambda r: r.start_ms).slot}" for s, n in moved.items())
              + f" (released together; measured from {', '.join(how)})")
    detail += f"; start {run.attempts}" + (f"; not the designed shape: {why}" if why else "")
    return Check("start", "pass" if not why else "skip", detail)


def all_error(m: Measured) -> list[Check]:
    """The bug: every request in play when the pool ran out got the context error, at once."""
    run, evs = m.run, m.overflows
    errored = [o.slot for o in run.outcomes if o.outcome == "errored" and o.error == EXCEEDED]
    if not evs:
        return [_check("all-slots-errored", False, f"no request got '{EXCEEDED}'")] + server_checks(m)
    play = [s.slot for s in evs[0].in_play]
    missed = [s for s in play if s not in errored]
    return [_check("all-slots-errored", not missed,
                   f"{len(errored)}/{len(run.outcomes)} slots got '{EXCEEDED}'; in play at the overflow (measured): "
                   f"{play}" + (f", not errored: {missed}" if missed else ""))] + server_checks(m)


def unchanged(m: Measured) -> list[Check]:
    done = _slots(m.run.outcomes, "completed")
    return [_check("all-completed", len(done) == len(m.run.outcomes),
                   f"{len(done)}/{len(m.run.outcomes)} completed")] + server_checks(m)


def one_victim(m: Measured, witness_expected: bool = False) -> list[Check]:
    """The eviction, judged on measurements (measure.py); the patch's log is a second witness."""
    run, wl, policy, evs = m.run, m.wl, m.policy, m.overflows
    errored = [o for o in run.outcomes if o.outcome == "errored"]
    survivors = [o for o in run.outcomes if o.outcome != "errored"]
    terminated = {s for e in evs for s in e.terminated}
    bad = [e for e in evs if len(e.terminated) != 1 or not e.full]
    checks = [
        _check("one-victim-per-overflow", bool(evs) and not bad and len(errored) == len(evs),
               ("no request was terminated" if not evs else
                "; ".join(("ok " if e not in bad else "WRONG ") + e.describe() for e in evs))
               + (f"; errored outside any overflow: {sorted(set(o.slot for o in errored) - terminated)}"
                  if len(errored) != sum(len(e.terminated) for e in evs) else "")),
        # an eviction is what it does (a request ended while others went on), whatever it says: the
        # text is reported, never judged (a fork's 503 "slot evicted ... retry later" is as right)
        Check("victim-error-text", "pass" if errored else "skip",
              f"victims got {sorted({o.error for o in errored})}"
              + ("" if all(o.error == EXCEEDED for o in errored) else " (not upstream's text: reported, not judged)")
              if errored else "no victim"),
    ]
    # expected: every slot within the measured doubt of the policy's choice is a right victim (the
    # policy's own equivalence: four equal requests, any of the four; several prompts measured
    # together, any whose range reaches the largest's); a victim outside that band is evidence
    # against the patch
    wrong = [e for e in evs if not set(e.terminated) <= set(e.expected)]
    checks.append(_check(
        f"victim-is-{policy}", bool(evs) and not wrong,
        "; ".join(f"terminated {list(e.terminated)}, measured {policy}: {list(e.expected)}"
                  + ((f" (tied within the measurement's doubt of {e.uncertainty} cells: any of them is right)"
                      if any(e.at(s).spread for s in e.expected) else " (equal: any of them is right)")
                     if len(e.expected) > 1 else f" (margin {e.margin} cells, uncertainty {e.uncertainty})")
                  + ("" if set(e.terminated) <= set(e.expected) else " OUTSIDE the policy's choice")
                  for e in evs) or "no eviction measured"))
    checks.append(witness(m, witness_expected))
    checks.append(victim_stops(m))
    if wl.expect.overflow_shape:
        if policy != "largest":
            checks.append(Check("designed-shape", "skip", f"this workload's shape is designed for the largest "
                                f"policy; under {policy} only its overflow is judged"))
        elif not evs:
            checks.append(_check("designed-shape", False, "no eviction measured"))
        else:
            # the shape this workload is designed to reach: missing it (timing, a tie) is no evidence
            checks += [_reached(name, ok, why) for name, ok, why in m.designed]
    short = [(o.slot, o.outcome, len(o.tokens)) for o in survivors
             if o.outcome != "completed" or len(o.tokens) != o.n_predict]
    checks.append(_check("survivors-complete", not short and bool(survivors),
                         f"{len(survivors)} survivors got all their tokens" if not short
                         else f"incomplete survivors (slot, outcome, tokens): {short}"))
    return checks + server_checks(m)


def victim_stops(m: Measured) -> Check:
    """A terminated request stops in the step that terminates it (upstream's log): its task decodes
    nothing after its error, and its slot is released before the server's loop takes its next
    tasks. A patch that sends the error but does not release the slot leaves it to the HTTP
    layer's cancel, which the loop takes only between steps: every outcome looks right, the cancel
    usually beats the next step, and the bug is a race the check must not wait for (section 11)."""
    if not m.run.trace:
        return Check("victim-stops", "skip", "the server printed no verbose log")
    if m.not_stopped:
        return _check("victim-stops", False, "; ".join(m.not_stopped))
    return _check("victim-stops", True, "no terminated request's task decoded anything after its error"
                  + (", and each was released in the step that sent it" if m.release_judged else
                     " (when it was released is not judged: the log has no loop lines)") + " (upstream's log)")


def witness(m: Measured, expected: bool = False) -> Check:
    """The patch's own eviction lines must agree with the measurement: same victims in the same
    order, same offset, the cells of every slot a line names within the measurement's
    uncertainty. `expected`: the candidate is patchkit's eviction, which logs one line per
    eviction, so a line that cannot be read (its wording changed, or it was never printed) fails:
    a witness that cannot testify is not a witness that agrees."""
    evs: tuple[Overflow, ...] = m.overflows
    logged = [e for e in m.run.events if e.kind == "evict"]
    if not logged:
        if expected and evs:
            return Check("witness-agrees", "fail", f"{len(evs)} eviction(s) measured, but no eviction line of the "
                         "patch could be read in the server log (expected one per eviction: 'KV cache is full: "
                         "terminating slot N (C cells, ...) so that K other slots can continue, off = O')")
        return Check("witness-agrees", "skip", "the candidate logs no eviction line (not patchkit's patch)"
                     if not expected else "no eviction measured, and no eviction line logged")
    problems = []
    if [e.victim for e in logged] != [t for ev in evs for t in ev.terminated]:
        problems.append(f"log names victims {[e.victim for e in logged]}, measured "
                        f"{[t for ev in evs for t in ev.terminated]}")
    for lg, ev in zip(logged, evs):
        if lg.off != ev.off:
            problems.append(f"log says off {lg.off}, measured {ev.off}")
        for slot, cells in [(lg.victim, lg.cells), *lg.others]:
            m = ev.at(slot)
            if m is None:
                problems.append(f"log lists slot {slot}, not in play by measurement")
            elif abs(m.cells - cells) > m.spread:
                problems.append(f"log says slot {slot} held {cells} cells, measured {m.cells}"
                                + (f"±{m.spread}" if m.spread else ""))
    return _check("witness-agrees", not problems, "the patch's log agrees with the measurement"
                  if not problems else "; ".join(problems))


def integrity(m: Measured, control: Run) -> list[Check]:
    """Survivors' token streams equal the control's; a victim's stream is a prefix of it.

    With `expect.integrity = "after-overflow"` (a real model, whose numerics depend on the batch
    mix: a start one step apart changes the batch) a difference that begins before the slot's
    overflow step cannot be the eviction's doing, so the control cannot judge that slot: it is
    reported, not failed. A difference from the overflow step on is the patch's, and fails."""
    run, lenient = m.run, m.wl.expect.integrity == "after-overflow"
    steps = {}
    if lenient:
        for ev in m.overflows:
            for s in ev.in_play:
                steps.setdefault(s.slot, s.generated)
    ctl = {o.slot: o for o in control.outcomes}
    problems, unjudged = [], []
    for o in run.outcomes:
        ref = ctl.get(o.slot)
        if ref is None or ref.outcome != "completed":
            problems.append(f"slot {o.slot}: control did not complete")
            continue
        pos = first_difference(o.tokens, ref.tokens)
        if o.outcome == "errored" and (pos is None or pos >= len(o.tokens)):
            continue  # a victim's stream is a prefix of the control's
        if pos is None:
            continue
        who = f"slot {o.slot}{' (victim)' if o.outcome == 'errored' else ''}"
        if lenient and pos < steps.get(o.slot, len(o.tokens) + 1):
            unjudged.append(f"{who} at token {pos}, before its overflow step {steps.get(o.slot, '-')}")
        else:
            problems.append(f"{who}: differs from control at token {pos}")
    if problems:
        return [Check("integrity", "fail", "; ".join(problems + [f"(not judged: {', '.join(unjudged)})"] * bool(unjudged)))]
    if unjudged:
        return [Check("integrity", "skip", "streams differ from the control before any eviction ("
                      + "; ".join(unjudged) + "): this model's numerics depend on the batch mix, so the control "
                      "cannot judge those slots; every other slot equals it, and nothing differs from an overflow "
                      "step on")]
    return [Check("integrity", "pass", "survivors equal the control token for token; victims are prefixes")]


def first_difference(a, b) -> int | None:
    """First index where a and b differ; len of the shorter if one is a prefix; None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def same_as(run: Run, base: Run | None) -> list[Check]:
    """The patch must not change anything: same outcome and error, slot by slot; the same tokens
    for requests that finished, and for requests that errored one stream a prefix of the other
    (where in its stream a request errors depends on the step the requests started in, which
    two independent runs do not share)."""
    if base is None:
        return [Check("same-as-base", "skip", "no base run to compare with")]
    ref = {o.slot: o for o in base.outcomes}
    diffs, notes = [], []
    for o in run.outcomes:
        b = ref.get(o.slot)
        if b is None or (o.outcome, o.error) != (b.outcome, b.error):
            diffs.append(f"slot {o.slot}: {b.outcome if b else '-'} -> {o.outcome}")
            continue
        pos = first_difference(o.tokens, b.tokens)
        if pos is None:
            continue
        if o.outcome == "errored" and pos == min(len(o.tokens), len(b.tokens)):
            notes.append(f"slot {o.slot} errored after {len(b.tokens)} / {len(o.tokens)} tokens")
        else:
            diffs.append(f"slot {o.slot}: {b.outcome} -> {o.outcome}, tokens differ at {pos}")
    if diffs:
        return [Check("same-as-base", "fail", "; ".join(diffs))]
    return [Check("same-as-base", "pass", "every slot's outcome and error equal the base run's, tokens equal"
                  + (f" (errored streams are prefixes of each other: {'; '.join(notes)})" if notes else ""))]


# How far each outcome got: a request may move up this ladder from before to after, never down.
RANK = {"completed": 3, "truncated": 2, "errored": 1, "rejected": 1, "timeout": 0, "crashed": 0}


def no_regression(run: Run, before: Run | None, wl: Workload, victims: frozenset[int] = frozenset()) -> list[Check]:
    """Slot by slot against the before side (the nightly without the change): nothing that worked
    before works less now. A request that completed must complete; a truncated one must get at
    least as many tokens; none may newly crash or time out. Streams are compared where the
    integrity oracle holds (greedy decoding on the tiny models is batch-invariant, measured): the
    shorter stream must be a prefix of the longer. On a real model (`integrity = "after-overflow"`)
    token differences are reported, not failed: its numerics depend on the batch mix.

    `victims`: where both sides evict, the slots the candidate's evictions ended as the policy's
    measured choice (within the band victim-is-<policy> judges). Which slot holds the most cells at the overflow
    is timing (two requests' prefills a step apart), so the before side may have ended another one:
    a victim is no regression while the candidate ends no more requests than the before side did
    (measured: a harmless pin on an evicting base ended slot 2 where the base had ended slot 3)."""
    if before is None:
        return [Check("no-regression", "skip", "no before-side run to compare with")]
    ref = {o.slot: o for o in before.outcomes}
    ended_before = sum(RANK.get(o.outcome, 0) < RANK["completed"] for o in before.outcomes)
    excused = victims if len(victims) <= ended_before else frozenset()
    worse, differ, better, ended_here = [], [], [], []
    for o in run.outcomes:
        b = ref.get(o.slot)
        if b is None:
            continue
        if o.slot in excused and o.outcome == "errored" and b.outcome != "errored":
            ended_here.append(o.slot)
        elif RANK.get(o.outcome, 0) < RANK.get(b.outcome, 0) or (b.outcome == "truncated" and len(o.tokens) < len(b.tokens)):
            worse.append(f"slot {o.slot}: {b.outcome} ({len(b.tokens)} tokens) -> {o.outcome} ({len(o.tokens)} tokens"
                         + (f", '{o.error}'" if o.error else "") + ")")
            continue
        if RANK.get(o.outcome, 0) > RANK.get(b.outcome, 0):
            better.append(f"slot {o.slot}: {b.outcome} -> {o.outcome}")
        pos = first_difference(o.tokens, b.tokens)
        if pos is not None and pos < min(len(o.tokens), len(b.tokens)):
            differ.append(f"slot {o.slot}: tokens differ from the before side at token {pos}")
    lenient = wl.expect.integrity == "after-overflow"
    problems = worse + ([] if lenient else differ)
    detail = ("; ".join(problems) if problems else
              "no request does worse than on the before side" + (f"; better: {', '.join(better)}" if better else "")
              + (f"; the eviction's victim here is slot {', '.join(map(str, ended_here))} (the policy's measured choice "
                 f"at its overflow); the before side ended {ended_before} request(s) too" if ended_here else "")
              + ("; streams agree where both ran" if not differ else f"; not judged (real model): {'; '.join(differ)}"))
    return [Check("no-regression", "fail" if problems else "pass", detail)]


def reference(m: Measured) -> list[Check]:
    """The before side when it is not judged (it is what the change is compared with)."""
    run, evs = m.run, m.overflows
    what = ("evicted: " + "; ".join(f"terminated {list(e.terminated)} of {[s.slot for s in e.in_play]}" for e in evs)
            if m.evicts else
            "every request in play errored at the overflow" if evs else
            "outcomes " + ", ".join(f"{o.slot}:{o.outcome}" for o in run.outcomes))
    return [Check("reference", "skip", f"the before side, compared with, not judged: {what}")]


# The expectations a candidate can be judged by (`--expect`, a family's patch.toml `expect`); `auto`
# picks one by measurement (verify.expectations). One registry: the CLI's choices come from here.
EXPECTATIONS = ("eviction", "preemption", "no-regression")


# Checks that say whether a run had the shape its workload is designed for: the reason a start is
# made again, so an earlier start is not failed by them (it is judged by everything else).
SHAPE_CHECKS = ("shift-exercised", "victim-entry-decoded", "cells-not-prompt", "victim-straddled", "designed-pairs",
                "designed-shape")


@dataclass(frozen=True)
class Promises:
    """What patchkit's own series promises beyond the property every right patch keeps. A foreign
    candidate (a fork's branch, a reviewer's diff) promises none of these: it is judged on the
    property alone (issue 28: right patches by other authors never fail on our arithmetic).
    - witness: its eviction logs one line per eviction, which must be readable and agree;
    - park_bound: a request parked that many times is passed over while another can go;
    - resume_path: how a parked slot comes back, "swap" (its sequence read back from host memory)
      or "recompute" (nothing held); "" not promised (a hybrid budget between 0 and no limit);
    - resume_cells: what a resumed slot holds, "exact" (the cells it held at the park) or "pending"
      (those and its pending sampled token, decoded with them); "": either (the property's band);
    - counters: its /metrics counts what it does (llamacpp:kv_full_*), each counter equal to the
      events measured;
    - parked_first: a request that arrives while another is parked starts only once every parked
      one is back (first come, first served).
    promises.py says where a candidate's promises come from (a trailer, its code, a declaration)."""
    witness: bool = False
    park_bound: int = 0
    resume_path: str = ""
    resume_cells: str = ""
    counters: bool = False
    parked_first: bool = False


NONE = Promises()


def judge(m: Measured, side: str, index: int = 0, control: Run | None = None, base: Run | None = None,
          expect: str = "eviction", base_reference: bool = False, own: Promises = NONE) -> Verdict:
    """The run's verdict, and every earlier start of it (made again for its shape) judged too:
    a start is never dropped for its verdict. An earlier start that did not overflow at all is
    held to "every request completes"."""
    v = _judge(m, side, index, control, base, expect, base_reference, own)
    if not m.earlier:
        return v
    problems: dict[str, list[tuple[int, str]]] = {}   # the same failure of many starts: one line
    for e in m.earlier:
        overflowed = bool(e.overflows) or any(o.outcome == "errored" for o in e.run.outcomes)
        # a start whose base never met a full pool (layout A) is held to the one rule for that, as
        # the judged start is: "every request completes" is no promise where the server truncates
        checks = (_judge(e, side, index, control, base, expect, base_reference, own).checks
                  if overflowed or pool_end_not_reached(e, side, base, expect, base_reference)
                  else tuple(unchanged(e)))
        for c in checks:
            if c.status == "fail" and c.name not in SHAPE_CHECKS:
                problems.setdefault(f"{c.name}: {c.detail}", []).append((e.run.attempts, e.run.log))
    return Verdict(v.workload, v.side, v.run_index, v.checks + (Check(
        "earlier-starts", "fail" if problems else "pass",
        "; ".join(f"start {ks[0][0]} ({ks[0][1]}): {what}" if len(ks) == 1 else
                  f"starts {_ranges([k for k, _ in ks])} ({len(ks)} starts, first log {ks[0][1]}): {what}"
                  for what, ks in problems.items())
        if problems else f"{len(m.earlier)} earlier start(s), made again for their shape, pass every other check"),))


def _ranges(ks: list[int]) -> str:
    """[2, 3, 4, 7] -> '2-4, 7'."""
    out, ks = [], sorted(ks)
    start = prev = ks[0]
    for k in ks[1:] + [None]:
        if k is not None and k == prev + 1:
            prev = k
            continue
        out.append(f"{start}-{prev}" if prev > start else f"{start}")
        if k is not None:
            start = prev = k
    return ", ".join(out)


def _judge(m: Measured, side: str, index: int = 0, control: Run | None = None, base: Run | None = None,
           expect: str = "eviction", base_reference: bool = False, own: Promises = NONE) -> Verdict:
    """expect "eviction": the workload's own expectations (base shows the bug, candidate evicts
    one). With `base_reference` (the base already evicts, or it is the fork's current nightly in
    the pin gate) the base side is not judged but compared with: the candidate must also not
    regress from it. "no-regression": the base side is a reference; the candidate must not do
    worse on any request, and its server must stay healthy."""
    run, wl = m.run, m.wl
    if not_reached := pool_end_not_reached(m, side, base, expect, base_reference):
        # the one rule for a design not reached: a base that never ran out of pool cannot show the
        # bug, so neither side is judged by it; the candidate must still not do worse than the base
        checks = [Check("pool-end-reached", "inconclusive", not_reached)]
        if side == "candidate":
            checks += no_regression(run, base, wl)
        return Verdict(wl.name, side, index, (*checks, *server_checks(m)))
    if expect == "preemption" and side == "candidate" and wl.expect.base == "all-error":
        # on an overflow workload; a workload whose base does not overflow (fits, single-slot) keeps
        # its own expectation below: a preemption must change nothing there
        # a model measured not batch-invariant cannot be held to its control once the batch changed
        return Verdict(wl.name, side, index, tuple(server_checks(m) + preemption(
            m, control, exact=wl.expect.integrity is True, own=own)))
    if expect == "no-regression" or (side == "base" and base_reference):
        checks = (reference(m) if side == "base"
                  else no_regression(run, base, wl, policy_victims(m)) + server_checks(m))
        return Verdict(wl.name, side, index, (start_shape(m), *checks))
    mode = wl.expect.base if side == "base" else wl.expect.candidate
    if mode == "same":
        checks = server_checks(m) + (same_as(run, base) if side == "candidate" else [])
    elif mode == "all-error":
        checks = all_error(m)
    elif mode == "unchanged":
        checks = unchanged(m)
    elif mode == "one-victim":
        checks = one_victim(m, witness_expected=own.witness and side == "candidate")
        if own.counters and side == "candidate":
            checks.append(counters(m, "eviction"))
    else:
        raise ValueError(f"unknown expectation '{mode}' in workload {wl.name}")
    if side == "candidate" and wl.expect.integrity:
        checks += integrity(m, control) if control else [Check("integrity", "skip", "no control run")]
    if side == "candidate" and base_reference:
        checks += no_regression(run, base, wl, policy_victims(m) if mode == "one-victim" else frozenset())
    return Verdict(wl.name, side, index, (start_shape(m), *checks))


def policy_victims(m: Measured) -> frozenset[int]:
    """The requests this run's evictions ended as the policy's measured choice (within its band)."""
    return frozenset(s for e in m.overflows for s in e.terminated if s in e.expected)


def pool_end_not_reached(m: Measured, side: str, base: Run | None, expect: str, base_reference: bool) -> str:
    """Why this overflow workload's design was not reached on the base ('' when it was): no request
    of the base run met a full pool. Measured on layout A, whose server caps each slot at n_ctx/np
    (each request ends at its own context, never the pool's); also a base start whose requests
    never met in the pool. A candidate's run is judged as it is when it met a full pool itself (it
    evicted or parked): what it did there is evidence whatever the base's start did."""
    if expect not in ("eviction", "preemption") or base_reference or m.wl.expect.base != "all-error":
        return ""
    if (base is None and side == "candidate") or m.overflows or m.preempts or any(
            o.outcome == "errored" for o in m.run.outcomes + (base.outcomes if side == "candidate" else ())):
        return ""
    ref = base if side == "candidate" else m.run
    ends = sorted({f"{o.outcome}" + (f" ('{o.error}')" if o.error else "") for o in ref.outcomes})
    return (f"the base never ran out of pool on this run: no request met a full pool (its requests ended "
            f"{', '.join(ends)}), so the bug this workload shows was not reproduced and the patch's handler "
            "was not exercised. Not evidence either way: a server that caps each slot at n_ctx/np (layout A) "
            "or a start whose requests never met does this; retry with --repeat, or use a tree whose base "
            "shows the bug.")


# ------------------------------------------------------------------ preemption (park / recompute)

# A pause may hold at most this many server steps in which nothing decoded at all: the resume is
# tried at the top of every step, so with nothing running a parked request must come back at once.
IDLE_STEPS_BOUND = 2


EVICTIONS, PARKS, RESUMES, PARKED = ("llamacpp:kv_full_evictions_total", "llamacpp:kv_full_parks_total",
                                     "llamacpp:kv_full_resumes_total", "llamacpp:requests_parked")
RECOMPUTED, PARKED_BYTES = "llamacpp:kv_full_recomputed_cells_total", "llamacpp:kv_full_parked_bytes"


def counters(m: Measured, expect: str) -> Check:
    """A series that promises counters (patchkit's: llamacpp:kv_full_* in /metrics, read once after
    the workload and its probes) is held to the events measured: each eviction is a request the
    clients saw end with an error; each park a pause in upstream's log, each resume a pause that
    came back, each recomputed cell one the resumed slot held; and nothing is left parked."""
    run = m.run
    if run.metrics is None:
        return Check("metrics-count-events", "skip", "/metrics was not read: the server did not answer after the run")
    slack = 0   # parks upstream's log cannot time: back at the next step (measure.unseen_parks)
    if expect == "eviction":
        want = {EVICTIONS: (sum(o.outcome == "errored" for o in run.outcomes), "requests ended with an error")}
    else:
        ps = [p for v in m.pauses.values() for p in v]
        back = [p for p in ps if p.resumed]
        slack = m.unseen_parks
        want = {PARKS: (len(ps), "pauses measured"), RESUMES: (len(back), "pauses that came back"),
                PARKED: (0, "every request ended")}
        if run.metric(RECOMPUTED) is not None and not slack:
            want[RECOMPUTED] = (sum(p.cells for p in back if not p.restored), "cells held by the recomputed resumes")
        if run.metric(PARKED_BYTES) is not None:
            want[PARKED_BYTES] = (0, "every request ended")

    def right(name: str, n: int) -> bool:
        got = run.metric(name)
        return got is not None and n <= got <= n + (slack if name in (PARKS, RESUMES) else 0)

    wrong = [f"{name} {run.metric(name)!s}, measured {n} ({what})" if run.metric(name) is not None else
             f"{name} missing from /metrics (promised; measured {n} {what})"
             for name, (n, what) in want.items() if not right(name, n)]
    return _check("metrics-count-events", not wrong, "; ".join(wrong) if wrong else
                  "/metrics after the run: " + ", ".join(f"{name.split(':')[1]} {run.metric(name):g}"
                                                        for name in want) + ", as measured"
                  + (f" (up to {slack} park(s) back at the next step, which upstream's log cannot time)"
                     if slack else ""))


def preemption(m: Measured, control: Run | None, exact: bool = True, own: Promises = NONE) -> list[Check]:
    """What a preemption (park by swap, or recompute) promises, measured: no request fails; each
    stream equals the same request's control run token for token (the control: the same requests
    in a pool with room for all); every cell comes back (a request of nearly the whole pool
    completes afterwards); no request waits while nothing runs; and on a workload whose base
    overflows, a request was parked at all (else nothing was exercised). `exact=False` (a recompute
    on a backend measured not to be batch-invariant): differences are reported, not failed.
    `own`: what patchkit's own series promises besides (Promises): the starvation bound, the resume
    path (a foreign design may bound starvation or keep parked bytes otherwise: not judged)."""
    run, wl, outs = m.run, m.wl, m.run.outcomes
    # a request that needs more cells than the whole pool holds cannot complete under any strategy: it
    # must end with the context error (read from the workload, not measured: its prompt, shared by an
    # n_cmpl family, plus n_predict per member > -c)
    too_big = {r.slot: r for r in wl.requests if len(r.prompt) + r.n_cmpl * r.n_predict > wl.server.ctx}

    def filled_alone(o) -> bool:
        # Excused only once it alone held the pool: a right preemption parks every request it can
        # before it fails the one that cannot fit, so ending earlier is evidence (issue 34). Its
        # members generate in step, so it held its prompt plus n_cmpl times the parent's streamed
        # tokens, each member up to a pending token and one step short.
        r = too_big[o.slot]
        return len(r.prompt) + r.n_cmpl * len(o.tokens) >= wl.server.ctx - 2 * r.n_cmpl
    failed = [o for o in outs if o.outcome != "completed"
              and not (o.slot in too_big and o.error == EXCEEDED and filled_alone(o))]
    excused = [o.slot for o in outs if o.outcome != "completed" and o not in failed]
    early = [o for o in failed if o.slot in too_big and o.error == EXCEEDED]
    checks = [_check("no-request-fails", not failed,
                     "; ".join(f"slot {o.slot}: {o.outcome} after {len(o.tokens)}/{o.n_predict} tokens"
                               + (f" ({o.error})" if o.error else "")
                               + (f": it needs more than the pool, but ended holding "
                                  f"{len(too_big[o.slot].prompt) + too_big[o.slot].n_cmpl * len(o.tokens)} of "
                                  f"{wl.server.ctx} cells, before it alone filled it" if o in early else "")
                               for o in failed)
                     if failed else f"all {len(outs) - len(excused)} requests that fit the pool completed"
                     + "".join(f"; slot {k} " + (
                         "needs more than the whole pool (no strategy completes it)" if too_big[k].n_cmpl == 1 else
                         f"is an n_cmpl = {too_big[k].n_cmpl} family bigger than the pool together: excused as a "
                         "limit of this design, not as impossible (its members could run one after another, but a "
                         "family member is never parked: they share the parent's cells)")
                         + "; it got the context error once it alone filled the pool" for k in excused))]
    ps = m.pauses
    n = sum(len(v) for v in ps.values())
    if wl.expect.base == "all-error":
        checks.append(_check("parks-measured", n > 0,
                             f"{n} pause(s) measured in upstream's log: " + describe_pauses(ps) if n
                             else "no request paused while others went on: this run exercised no preemption"))
    if m.policy == "largest" and not m.overflows:
        # the shape a preempting run is designed to reach (runner.py re-makes a start that missed it
        # while its budget lasts): a check of the run, not of the patch; missing it is no evidence
        checks += [_reached(name, held, why) for name, held, why in m.designed]
    # The property, not one implementation's arithmetic (issue 28): at resume the cache holds exactly
    # the slot's tokens so far, the ones it had decoded (the cells it held at the park) and, for a
    # design that prefills it with the history (the fork's one-path recompute), the sampled token
    # whose decode was pending: cells_before or cells_before + 1. Fewer: tokens lost (a recompute that
    # forgot the generated ones); more: cells that are no token of the slot's.
    # A series that promises one of the two (own.resume_cells) is held to it: recompute-slot to the
    # cells it held, recompute-prefill-slot to those and its pending token.
    band = {"exact": (0,), "pending": (1,)}.get(own.resume_cells, (0, 1))
    said = {(0,): "the cells it held when it paused (its series' promise)",
            (1,): "the cells it held when it paused plus its pending sampled token (its series' promise)",
            (0, 1): "the cells it held when it paused, or those plus its pending sampled token"}[band]
    moved = [p for v in ps.values() for p in v if p.resumed and p.cells - p.cells_before not in band]
    if n:
        checks.append(_check("resumes-where-paused", not moved,
                             "; ".join(f"slot {p.slot}: paused holding {p.cells_before} cells, resumed holding {p.cells}"
                                       f" (promised: {said})" for p in moved) if moved else
                             f"every resumed request came back holding exactly its tokens so far: {said}"))
    if n:
        unfreed = m.unfreed_parks
        checks.append(_check("parks-free-cells", not unfreed, "; ".join(unfreed) if unfreed else
                             "after every park the retry at the same offset found the cells it freed"))
    park_bound = own.park_bound
    if n and park_bound:
        starved = [p for p in m.parks_in_order if p.before >= park_bound and any(c < park_bound for _, c in p.rivals)]
        checks.append(_check("parks-bounded", not starved, "; ".join(
            f"slot {p.slot} parked a {p.before + 1}th time at step {p.step}, while "
            + ", ".join(f"slot {s} ({c} park(s))" for s, c in p.rivals if c < park_bound) + " generated beside it"
            for p in starved) if starved else
            f"no request was parked again after {park_bound} parks while another, parked fewer times, generated "
            f"beside it (most parks of one request: {max(p.before + 1 for p in m.parks_in_order)})"))
    if n and own.parked_first:
        checks.append(parked_first(m))
    if n and own.resume_path:
        resumed = [p for v in ps.values() for p in v if p.resumed]
        wrong = [p for p in resumed if p.restored != (own.resume_path == "swap")]
        checks.append(_check("resume-path", not wrong, "; ".join(
            f"slot {p.slot} (paused at token {p.at_token}) " + ("was read back from host memory (upstream's state "
            "reader) although its series keeps nothing parked" if p.restored else "came back without its "
            "sequence read back from host memory (no state read for it in upstream's log): recomputed, not swapped")
            for p in wrong) if wrong else
            f"every resume ({len(resumed)}) came back as its series promises: "
            + ("its sequence read back from host memory (upstream's state reader)" if own.resume_path == "swap"
               else "recomputed, nothing read back from host memory")))
    if own.counters:
        checks.append(counters(m, "preemption"))
    if control is None:
        checks.append(Check("streams-exact", "skip", "no control run"))
    else:
        ctl = {o.slot: o for o in control.outcomes}
        diffs = []
        for o in outs:
            ref = ctl.get(o.slot)
            if ref is None or ref.outcome != "completed":
                diffs.append(f"slot {o.slot}: control did not complete")
                continue
            pos = first_difference(o.tokens, ref.tokens)
            if o.slot in excused and (pos is None or pos >= len(o.tokens)):
                continue  # a request bigger than the pool: its stream up to the error is a prefix of the control's
            if pos is not None:
                after = [p for p in ps.get(o.slot, ()) if p.at_token <= pos]
                diffs.append(f"slot {o.slot}: differs from its control at token {pos} "
                             + (f"(after its pause at token {after[-1].at_token})" if after
                                else "(before any pause of its own)"))
        resumed = sorted(s for s, v in ps.items() if any(p.resumed for p in v))
        n_resumes = sum(p.resumed for v in ps.values() for p in v)
        if not diffs:
            checks.append(Check("streams-exact", "pass", "every stream equals its control token for token"
                                + (f", resumed ones included (slots {resumed}): {n_resumes} resume(s) judged"
                                   if resumed else "")))
        else:
            checks.append(Check("streams-exact", "fail" if exact else "skip", "; ".join(diffs)
                                + ("" if exact else " (reported, not failed: this model's greedy stream was measured to "
                                                    "depend on the batch mix, so a changed batch changes it)")))
    checks.append(_check("pool-returns-empty", run.pool_probe == "completed",
                         "a request of nearly the whole pool completed after the workload: every cell came back"
                         if run.pool_probe == "completed" else
                         f"a request of nearly the whole pool after the workload: {run.pool_probe or 'not made'}"))
    stuck = [p for v in ps.values() for p in v if not p.resumed or p.idle_steps > IDLE_STEPS_BOUND]
    checks.append(_check("waits-bounded", not stuck,
                         "; ".join(f"slot {p.slot} paused at token {p.at_token}: "
                                   + ("never resumed, " if not p.resumed else "")
                                   + f"{p.idle_steps} step(s) with nothing running (bound {IDLE_STEPS_BOUND})"
                                   for p in stuck) if stuck else
                         f"every pause ended with at most {IDLE_STEPS_BOUND} idle step(s) in it"))
    return checks


def parked_first(m: Measured) -> Check:
    """A request that arrived while another was parked starts only once every parked one is back
    (first come, first served). Not reached (nobody arrived during a park): skipped, not a verdict."""
    return parked_first_of(m.admissions)


def parked_first_of(admissions) -> Check:
    """parked_first from measured admissions (a workload's or the traffic's, pauses.py)."""
    if not admissions:
        return Check("parked-first", "skip", "no request arrived while one was parked (a shape not reached)")
    ahead = [a for a in admissions if not a.first]
    return _check("parked-first", not ahead, ("; ".join(
        f"task {a.task} (slot {a.slot}) arrived at step {a.arrived} and started at step {a.started}, while slot "
        f"{a.parked} was parked (since step {a.park_step}, "
        + (f"back at step {a.resume_step})" if a.resume_step >= 0 else "never back)") for a in ahead[:3])
        + (f" (+{len(ahead) - 3} more)" if len(ahead) > 3 else "")) if ahead else
        f"{len(admissions)} request(s) arrived while one was parked, each started only once it was back (first: "
        f"task {admissions[0].task} arrived at step {admissions[0].arrived}, slot {admissions[0].parked} back "
        f"at step {admissions[0].resume_step}, started at step {admissions[0].started})")


def describe_pauses(ps: dict[int, tuple[Pause, ...]]) -> str:
    return "; ".join(f"slot {s}: " + ", ".join(f"at token {p.at_token}" + (f" for {p.seconds:.2f} s" if p.seconds else "")
                                               + ("" if p.resumed else " (never resumed)") for p in v)
                     for s, v in sorted(ps.items()))


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
