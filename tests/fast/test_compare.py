"""Measurement -> verdict on recorded runs (made by tests/fast/sim.py, a forward model of the
server's decode loop): no processes. Includes runs with large start skew, arrival jitter, and
patches whose own log disagrees with what happened."""
import random
from dataclasses import replace

import pytest

from toolkit import compare, measure, verify
from toolkit.record import Outcome, Run, Trace, sanitizer_findings
from toolkit.workload import load

from .sim import simulate

WL = load("overflow-4")          # prompts 40/60/80/100: victim last in the batch
WF = load("victim-first")        # prompts 100/80/60/40: victim first, survivors must shift
WM = load("victim-middle")       # prompts 60/100/80/40


def prompts(wl):
    return [len(r.prompt) for r in wl.requests]


def sim(wl, **kw):
    return simulate(prompts(wl), 240, wl.server.ctx, **kw)


def control(wl=WL):
    return simulate(prompts(wl), 240, 8192)


def judge(wl, side="candidate", **kw):
    ctl = kw.pop("control", control(wl))
    return verify.judge(wl, side, sim(wl, patched=side == "candidate", **kw), control=ctl)


def failed(v):
    return {c.name: c.detail for c in v.checks if c.status == "fail"}


def stalls(seed, p=0.05, longest=0.004):
    """A loaded machine: now and then a slot's HTTP thread is not scheduled for up to `longest`
    seconds; tokens sampled meanwhile arrive together when it wakes (late, never early)."""
    rng = random.Random(seed)
    wake: dict[int, float] = {}

    def jitter(slot, k):
        t = k * 0.0002
        if wake.get(slot, 0) <= t and rng.random() < p:
            wake[slot] = t + rng.random() * longest
        return max(0.0, wake.get(slot, 0) - t) + rng.random() * 0.00003
    return jitter


def test_base_bug_reproduced():
    assert judge(WL, "base").ok


def test_a_base_that_never_meets_a_full_pool_is_not_reached_on_both_sides_never_a_fail():
    """Issue 34's one rule for a design not reached (measured on layout A, whose server caps each
    slot at n_ctx/np): the base's every request completed, so neither side can show the bug. It was
    a FAIL of `all-slots-errored` ("no request got ..."), evidence of nothing about the patch."""
    base = control()
    v = verify.judge(WL, "base", base)
    got = {c.name: c.status for c in v.checks}
    assert not failed(v) and got["pool-end-reached"] == "inconclusive" and "all-slots-errored" not in got, v
    assert "never ran out of pool" in next(c.detail for c in v.checks if c.name == "pool-end-reached")
    # the candidate, which met no full pool either, is held to the base's outcomes only
    cand = verify.judge(WL, "candidate", control(), control=control(), base=base)
    got = {x.name: x.status for x in cand.checks}
    assert got["pool-end-reached"] == "inconclusive" and got["no-regression"] == "pass", cand
    # ... and fails where it did worse than the base: that is evidence
    worse = replace(base, outcomes=tuple(replace(o, outcome="truncated") if o.slot == 2 else o
                                         for o in base.outcomes))
    cand = verify.judge(WL, "candidate", worse, control=control(), base=base)
    assert "slot 2: completed" in failed(cand)["no-regression"], failed(cand)
    # a candidate that met a full pool itself is judged on what it did, whatever the base's start did
    cand = verify.judge(WL, "candidate", sim(WL, patched=True), control=control(), base=base)
    assert "pool-end-reached" not in {x.name for x in cand.checks} and cand.ok, failed(cand)
    # layout A's server ends each request at its slot's share ("truncated"), in every start: the
    # earlier starts (made again for the shape) are held to the same rule, not to "all completed"
    cut = replace(base, outcomes=tuple(replace(o, outcome="truncated") for o in base.outcomes))
    again = replace(cut, attempts=3, earlier=(replace(cut, attempts=1), replace(cut, attempts=2)))
    for side in ("base", "candidate"):
        v = verify.judge(WL, side, again, control=control(), base=cut)
        got = {c.name: c.status for c in v.checks}
        assert not failed(v) and got["pool-end-reached"] == "inconclusive" and got["earlier-starts"] == "pass", v
    # the base's own runs that did meet a full pool are judged as ever
    assert judge(WL, "base").ok and "pool-end-reached" not in {x.name for x in judge(WL, "base").checks}


@pytest.mark.parametrize("wl", [WL, WF, WM], ids=lambda w: w.name)
def test_candidate_passes_on_measurements(wl):
    v = judge(wl)
    assert v.ok, failed(v)
    checks = {c.name: c for c in v.checks}
    assert checks["witness-agrees"].status == "pass"


def test_measured_cells_and_offset_match_the_simulated_server():
    ev, = measure.overflows(sim(WL), WL)
    assert ev.terminated == (3,) and ev.off == 0 and ev.full
    assert [(s.slot, s.cells, s.position) for s in ev.in_play] == [(0, 226, 0), (1, 246, 1), (2, 266, 2), (3, 286, 3)]


@pytest.mark.parametrize("verbose", [True, False], ids=["server-log", "client-records"])
@pytest.mark.parametrize("launch", [[0, 0, 1, 3], [0, 7, 2, 30], [9, 0, 3, 40], [0, 0, 60, 60]])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_large_start_skew_and_jitter_judged_on_measurement(launch, seed, verbose):
    """Requests that started up to 60 steps apart and arrive with stalls: the measured victim is
    still the policy's, whatever slot that turns out to be, and the verdict holds; from upstream's
    log, and from the client's own records when the server printed none."""
    r = sim(WL, launch=launch, jitter=stalls(seed), verbose=verbose)
    evs = measure.overflows(r, WL)
    truth = [e for e in r.events if e.kind == "evict"]
    assert [e.terminated for e in evs] == [(t.victim,) for t in truth]
    v = verify.judge(WL, "candidate", r, control=control())
    assert v.ok, failed(v)


@pytest.mark.parametrize("verbose", [True, False], ids=["server-log", "client-records"])
def test_false_witness_fails_on_measurement_even_with_jitter(verbose):
    """The patch evicts the runner-up and logs it as the largest: the measurement says otherwise."""
    for wl in (WL, WF, WM, load("staggered"), load("overflow-8")):
        n = len(wl.requests)
        r = simulate(prompts(wl), [r.n_predict for r in wl.requests], wl.server.ctx,
                     launch=[0 if r.start_ms == 0 else 75 for r in wl.requests], lie=True, jitter=stalls(n),
                     verbose=verbose)
        v = verify.judge(wl, "candidate", r, control=simulate(prompts(wl), [r.n_predict for r in wl.requests], 8192))
        f = failed(v)
        assert "victim-is-largest" in f and "witness-agrees" in f, (wl.name, f)
        assert "log says slot" in f["witness-agrees"] or "log names victims" in f["witness-agrees"]


@pytest.mark.parametrize("verbose", [True, False], ids=["server-log", "client-records"])
def test_two_victims_in_one_step_fail(verbose):
    v = judge(WL, evict_extra=True, verbose=verbose)
    f = failed(v)
    assert "one-victim-per-overflow" in f and "WRONG" in f["one-victim-per-overflow"]


@pytest.mark.parametrize("verbose", [True, False], ids=["server-log", "client-records"])
def test_shift_not_exercised_is_inconclusive_for_shift_workloads_only(verbose):
    """A start that missed its designed shape is no evidence against the patch (issue 34): the
    check is INCONCLUSIVE, never FAIL, and it says why."""
    # slot 0 (the victim) launched 1 step early: the pool fills at off 1, its entry already decoded
    r = sim(WF, launch=[0, 1, 1, 1], verbose=verbose)
    ev, = measure.overflows(r, WF)
    assert ev.terminated == (0,) and ev.off >= 1
    v = verify.judge(WF, "candidate", r, control=control(WF))
    assert v.ok and "shift-exercised" not in failed(v)
    shift = next(c for c in v.checks if c.name == "shift-exercised")
    assert shift.status == "inconclusive" and "already decoded" in shift.detail
    assert measure.shape(r, WF) is not None      # the runner would make this start again
    assert measure.shape(sim(WF, verbose=verbose), WF) is None     # the designed start


@pytest.mark.parametrize("verbose", [True, False], ids=["server-log", "client-records"])
def test_shape_is_the_policys_not_the_candidates(verbose):
    """A candidate that evicts the wrong slot on the designed start must be judged, not re-made:
    a shape read from the terminated slot retried count-positions (swa-victim-first, CI) until it
    happened to pick the largest, and the wrong-victim variant passed."""
    r = sim(WF, policy="smallest", verbose=verbose)        # terminates slot 3, the last entry
    ev, = measure.overflows(r, WF)
    assert ev.terminated == (3,) and ev.expected == (0,) and ev.off == 0
    assert measure.shape(r, WF) is None
    f = failed(verify.judge(WF, "candidate", r, control=control(WF)))
    assert "victim-is-largest" in f and "shift-exercised" not in f


def test_patch_log_is_not_needed_but_must_agree():
    v = judge(WL, log=False)
    assert v.ok and {c.name: c.status for c in v.checks}["witness-agrees"] == "skip"
    r = sim(WL)
    e = r.events[0]
    liar = replace(r, events=(replace(e, cells=e.cells + 5),))
    assert "log says slot 3 held 291" in failed(verify.judge(WL, "candidate", liar, control=control()))["witness-agrees"]
    wrong_off = replace(r, events=(replace(e, off=2),))
    assert "log says off 2, measured 0" in failed(verify.judge(WL, "candidate", wrong_off, control=control()))[
        "witness-agrees"]


def test_snapshots_make_survivor_counts_exact():
    r = sim(WF, launch=[0, 5, 1, 3], snapshots=(50, 90), jitter=stalls(7, p=0.3), verbose=False)
    ev, = measure.overflows(r, WF)
    assert all(s.spread == 0 and s.source in ("own stream", "/slots snapshot") for s in ev.in_play)
    truth = r.events[0]
    assert dict(truth.others) == {s.slot: s.cells for s in ev.in_play if s.slot != truth.victim}


def test_short_survivor_fails():
    r = sim(WL)
    outs = list(r.outcomes)
    outs[1] = replace(outs[1], outcome="truncated", tokens=outs[1].tokens[:200], token_t=outs[1].token_t[:200])
    assert "survivors-complete" in failed(verify.judge(WL, "candidate", replace(r, outcomes=tuple(outs))))


def test_integrity_reports_first_difference():
    r = sim(WF)
    outs = list(r.outcomes)
    bad = list(outs[1].tokens)
    bad[187] = 9
    outs[1] = replace(outs[1], tokens=tuple(bad))
    v = verify.judge(WF, "candidate", replace(r, outcomes=tuple(outs)), control=control(WF))
    assert "slot 1: differs from control at token 187" in failed(v)["integrity"]


def test_integrity_when_the_control_did_not_complete_says_so():
    ctl = control()
    broken = replace(ctl, outcomes=tuple(replace(o, outcome="errored") for o in ctl.outcomes))
    v = verify.judge(WL, "candidate", sim(WL), control=broken)
    assert "control did not complete" in failed(v)["integrity"]


def test_victim_must_be_prefix_of_control():
    r = sim(WL)
    outs = list(r.outcomes)
    v_toks = list(outs[3].tokens)
    v_toks[5] = 0
    outs[3] = replace(outs[3], tokens=tuple(v_toks))
    v = verify.judge(WL, "candidate", replace(r, outcomes=tuple(outs)), control=control())
    assert "slot 3 (victim): differs from control at token 5" in failed(v)["integrity"]


def test_dead_server_fails_even_if_outcomes_look_fine():
    r = replace(sim(WL), alive_after=False, exit_code=-11,
                followup="not sent: the server was not answering /health")
    why = failed(verify.judge(WL, "candidate", r))
    assert {"no-crash", "serves-after"} <= why.keys()
    # the follow-up's own outcome is quoted: a hang and a crash read differently
    assert why["serves-after"] == ("a request sent afterwards did not complete (not sent: the server was not "
                                   "answering /health)"), why["serves-after"]


def test_no_control_is_skip_not_pass():
    checks = {c.name: c for c in verify.judge(WL, "candidate", sim(WL)).checks}
    assert checks["integrity"].status == "skip"


def test_same_as_base():
    wl = load("single-slot")

    def one(n):
        o = Outcome(0, "truncated", 200, None, True, "limit", True, n, tuple(range(n)), 40, 400, 0, 0, 0)
        return Run("w", (o,), (), (), True, None, 0.3, "log")
    assert verify.judge(wl, "candidate", one(156), base=one(156)).ok
    assert not verify.judge(wl, "candidate", one(150), base=one(156)).ok


def test_first_difference():
    assert compare.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert compare.first_difference([1, 2], [1, 2, 3]) == 2
    assert compare.first_difference([1, 5, 3], [1, 2, 3]) == 1


def test_goodput():
    assert compare.goodput([]) is None
    g = compare.goodput([sim(WL)])
    assert (g.tokens, g.completed, g.requests) == (240 * 3 + 187, 3, 4)


def test_smallest_policy_measured():
    r = simulate(prompts(WL), 240, 1024, policy="smallest")
    ev, = measure.overflows(r, WL, "smallest")
    assert ev.terminated == (0,) and ev.expected == (0,)
    assert verify.judge(WL, "candidate", r, policy="smallest", control=control()).ok
    assert "victim-is-largest" in failed(verify.judge(WL, "candidate", r, policy="largest"))


def test_sanitizer_findings_fail_the_run():
    log = ("0.01 W srv ...\n==123==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x6020\n"
           "server-context.cpp:3650:17: runtime error: index 9 out of bounds for type 'int [8]'\n")
    found = sanitizer_findings(log)
    assert len(found) == 2 and "heap-buffer-overflow" in found[0]
    dirty = replace(sim(WL), sanitizer=found)
    assert "2 finding(s)" in failed(verify.judge(WL, "candidate", dirty))["no-sanitizer-findings"]
    assert sanitizer_findings("all good\n") == ()


def test_after_overflow_integrity_reports_early_differences_and_fails_late_ones():
    """A real model's stream depends on the batch mix: a difference before the overflow step is not
    the eviction's doing (reported, integrity skipped); one from the overflow step on fails."""
    lenient = replace(WL, expect=replace(WL.expect, integrity="after-overflow"))
    r = sim(WL)
    early = list(r.outcomes)
    toks = list(early[2].tokens)
    toks[1] = 99
    early[2] = replace(early[2], tokens=tuple(toks))
    run_early = replace(r, outcomes=tuple(early))
    c = {c.name: c for c in verify.judge(lenient, "candidate", run_early, control=control()).checks}["integrity"]
    assert c.status == "skip" and "slot 2 at token 1, before its overflow step 187" in c.detail
    assert "slot 2: differs from control at token 1" in failed(verify.judge(WL, "candidate", run_early,
                                                                              control=control()))["integrity"]
    late = list(r.outcomes)
    toks = list(late[1].tokens)
    toks[190] = 99
    late[1] = replace(late[1], tokens=tuple(toks))
    f = failed(verify.judge(lenient, "candidate", replace(r, outcomes=tuple(late)), control=control()))
    assert "slot 1: differs from control at token 190" in f["integrity"]


def test_server_log_measurement_is_exact_and_checked_against_the_streams():
    """Upstream's log gives every slot's cells at the failing step, even when the client read
    every stream in one burst (no arrival time says anything); and a log that is not this run's
    is caught by its tokens."""
    burst = sim(WF, launch=[0, 5, 1, 3], jitter=lambda slot, k: 0.5 - k * 0.0002)  # all arrive at 0.5 s
    ev, = measure.overflows(burst, WF)
    truth = burst.events[0]
    assert ev.terminated == (truth.victim,) and ev.off == truth.off and ev.full
    assert dict(truth.others) == {s.slot: s.cells for s in ev.in_play if s.slot != truth.victim}
    assert all(s.source == "server log" and s.spread == 0 for s in ev.in_play)
    assert measure.trace_problems(burst) == []
    other = sim(WF, launch=[0, 1, 0, 2])
    assert measure.trace_problems(replace(burst, trace=other.trace)) != []
    f = failed(verify.judge(WF, "candidate", replace(burst, trace=other.trace), control=control(WF)))
    assert "log-matches-streams" in f


def test_same_as_base_allows_an_errored_stream_to_stop_a_step_apart_but_nothing_else():
    wl = load("speculative")
    base = simulate([40, 60, 80, 100], 240, 1024, patched=False)
    later = simulate([40, 60, 80, 100], 240, 1024, patched=False, launch=[0, 0, 1, 0])
    c = {c.name: c for c in verify.judge(wl, "candidate", later, base=base).checks}["same-as-base"]
    assert c.status == "pass" and "prefixes" in c.detail
    outs = list(later.outcomes)
    toks = list(outs[1].tokens)
    toks[5] = 99
    outs[1] = replace(outs[1], tokens=tuple(toks))
    f = failed(verify.judge(wl, "candidate", replace(later, outcomes=tuple(outs)), base=base))
    assert "slot 1: errored -> errored, tokens differ at 5" in f["same-as-base"]
    evicted = simulate([40, 60, 80, 100], 240, 1024)
    assert "slot 0: errored -> completed" in failed(verify.judge(wl, "candidate", evicted, base=base))["same-as-base"]


def test_an_overflow_workload_without_an_overflow_is_made_again():
    """A late group that joined after the early pair was nearly done never met it in the pool:
    the runner makes such a start again (measured from upstream's log), the verdict would fail."""
    wl = load("staggered")
    p, n = [len(r.prompt) for r in wl.requests], [r.n_predict for r in wl.requests]
    late = simulate(p, n, wl.server.ctx, launch=[0, 0, 600, 600])
    assert not any(o.error for o in late.outcomes)
    why = measure.shape(late, wl)
    assert why.startswith("no overflow: the requests started generating up to") and int(why.split()[-3]) > 300
    assert measure.shape(simulate(p, n, wl.server.ctx, launch=[0, 0, 75, 75]), wl) is None


def test_a_step_without_a_sample_fails_one_sample_per_entry():
    """A stale batch index (no remap): the slot whose row moved is not sampled in that step and
    decodes its previous token again. Upstream's log shows it even when the streams do not."""
    r = simulate(prompts(WF), 240, WF.server.ctx)
    assert compare.sampling(measure.measure(r, WF)).status == "pass"
    trace = list(r.trace)
    k = [i for i, t in enumerate(trace) if t.kind == "token" and t.slot == 3][150]
    dup = next(t for t in reversed(trace[:k]) if t.kind == "entry" and t.slot == 3)
    # its sample dropped, its entry repeated one cell later (the first one was decoded; the same token at
    # the same cell count would be an entry taken out undecoded and made again: a preemption's resume)
    broken = replace(r, trace=tuple(trace[:k] + [replace(dup, value=dup.value + 1)] + trace[k + 1:]))
    c = compare.sampling(measure.measure(broken, WF))
    assert c.status == "fail" and c.detail.startswith("slot 3: decode #") and "the previous token again" in c.detail
    assert compare.sampling(measure.measure(replace(r, trace=()), WF)).status == "skip"


def test_compare_judges_a_measurement_and_never_measures():
    """Measure once, then judge (issue 27): compare.py takes a run's facts from one Measured record;
    from measure it imports the record, the types in it and a constant, never a function."""
    import ast
    import inspect
    tree = ast.parse(inspect.getsource(compare))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "measure" for a in n.names}
    assert imported == {"EXCEEDED", "Measured", "Overflow", "Pause"}
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and getattr(n.value, "id", "") == "measure"]
    r = simulate(prompts(WL), 240, WL.server.ctx)
    m = measure.measure(r, WL)
    assert m.overflows == measure.overflows(r, WL) and m.run is r and not m.preempts


@pytest.mark.parametrize("order,why", [
    (("error", "release", "loop"), None),                       # the patch releases its victim in the step
    (("release", "error", "loop"), None),                       # release first, then the error: the same step
    (("error", "loop", "release"), "released only after the step ended"),   # left to the HTTP cancel
    (("error", "loop"), "never released in the log"),
    (("error", "entry", "release", "loop"), "1 batch entry after it was sent the error"),
])
def test_a_terminated_task_stops_in_its_step(order, why):
    """The server takes queued tasks (an HTTP cancel) only at a loop turn: a release after the
    turn that follows the error is not the patch's, whatever the timing."""
    head = (Trace("launch", 0, 7), Trace("launch", 1, 8), Trace("loop"), Trace("step"))
    make = {"error": Trace("error", task=7, text=measure.EXCEEDED), "release": Trace("release", 0, 7, 12),
            "loop": Trace("loop"), "entry": Trace("entry", 0, 7, 12, 5)}
    outs = tuple(Outcome(j, o, None, None, True, None, None, None, (), 10, 4, 0.0, None, 0.1)
                 for j, o in ((0, "error"), (1, "completed")))
    run = Run("w", outs, (), (), True, None, 0.1, "", trace=head + tuple(make[k] for k in order))
    problems, judged = measure.not_stopped(run)
    assert judged
    assert (problems == []) if why is None else any(why in p for p in problems), problems
    # without the loop's lines the release's step cannot be judged, and is not claimed
    bare = replace(run, trace=tuple(t for t in run.trace if t.kind != "loop"))
    assert measure.not_stopped(bare)[1] is False


TIE = replace(WL, name="tie-4", requests=tuple(replace(r, prompt=tuple(range(3, 73))) for r in WL.requests))


@pytest.mark.parametrize("verbose", [True, False], ids=["server-log", "client-records"])
def test_a_tie_is_a_set_of_right_victims(verbose):
    """Four equal requests (issue 34's tie-4): every slot holds the most cells, so whichever the
    patch terminates is right; it was a FAIL ('AMBIGUOUS') before."""
    for key in (None, lambda j: j):                  # the first of the tie, or the last
        r = simulate([70] * 4, 240, TIE.server.ctx, key=key, verbose=verbose)
        v = verify.judge(TIE, "candidate", r, control=simulate([70] * 4, 240, 8192))
        victim = next(c for c in v.checks if c.name == "victim-is-largest")
        assert victim.status == "pass" and "any of them is right" in victim.detail, victim.detail


@pytest.mark.parametrize("verbose", [True, False], ids=["server-log", "client-records"])
def test_a_victim_outside_the_tie_still_fails(verbose):
    wl = replace(TIE, requests=TIE.requests[:3] + (replace(TIE.requests[3], prompt=tuple(range(3, 53))),))
    ctl = simulate([70, 70, 70, 50], 240, 8192)
    right = verify.judge(wl, "candidate", simulate([70, 70, 70, 50], 240, wl.server.ctx, key=lambda j: -j,
                                                   verbose=verbose), control=ctl)
    assert "victim-is-largest" not in failed(right)
    wrong = verify.judge(wl, "candidate", simulate([70, 70, 70, 50], 240, wl.server.ctx, policy="smallest",
                                                   verbose=verbose), control=ctl)
    assert "OUTSIDE the policy's choice" in failed(wrong)["victim-is-largest"]


def test_missing_decode_lines_are_inconclusive_not_a_pass():
    """Upstream rewords 'slot decode token': every slot's samples have no entries. Not evidence
    for the patch (it passed before) and not against it: INCONCLUSIVE, and the Result says so."""
    r = sim(WL)
    blind = replace(r, trace=tuple(t for t in r.trace if t.kind != "entry"))
    v = verify.judge(WL, "candidate", blind, control=control())
    c = next(c for c in v.checks if c.name == "one-sample-per-entry")
    assert c.status == "inconclusive" and "no 'slot decode token' entry" in c.detail
    res = verify.Result("repo", "b" * 40, "c" * 40, "candidate", None, "largest", None,
                        (verify.WorkloadResult(WL, (), (blind,), None, (v,)),), (), "")
    assert res.ok and res.outcome == "INCONCLUSIVE"
    full = verify.judge(WL, "candidate", r, control=control())
    assert verify.Result("repo", "b" * 40, "c" * 40, "candidate", None, "largest", None,
                         (verify.WorkloadResult(WL, (), (r,), None, (full,)),), (), "").outcome == "PASS"


EVICTED = "slot evicted: the KV cache is full, retry later"


@pytest.mark.parametrize("verbose", [True, False], ids=["server-log", "client-records"])
def test_an_eviction_is_what_it_does_not_what_it_says(verbose):
    """A fork's eviction answers its victim with its own text (issue 34: a 503 'slot evicted ...'):
    measured as an eviction by what happened, judged by the same checks, its text reported."""
    r = sim(WL, text=EVICTED, verbose=verbose)
    ev, = measure.overflows(r, WL)
    assert ev.terminated == (3,) and len(ev.in_play) == 4
    assert measure.evicts(r, WL)
    v = verify.judge(WL, "candidate", r, control=control())
    assert v.ok, failed(v)
    text = next(c for c in v.checks if c.name == "victim-error-text")
    assert text.status == "pass" and EVICTED in text.detail and "not upstream's text" in text.detail
    # the same text from a patch that picks the slot with the lowest id: its wrong victim, quoted
    wrong = verify.judge(WL, "candidate", sim(WL, text=EVICTED, verbose=verbose, key=lambda j: -j),
                         control=control())
    assert "OUTSIDE the policy's choice" in failed(wrong)["victim-is-largest"]


def test_a_log_that_ends_before_the_run_is_missing_evidence_not_a_fail():
    """Measured under load: a base run's log ended before its overflow (the server's exit line
    missing, every slot's logged tokens a prefix of its stream). Judged from the client's records,
    the log's check INCONCLUSIVE: it was a FAIL ('no request got ...')."""
    r = sim(WL, patched=False)
    cut = next(k for k, t in enumerate(r.trace) if t.kind == "error")
    early = replace(r, trace=tuple(t for t in r.trace[:cut - 40] if t.kind != "exit"))
    assert measure.log_truncated(early) and not measure.log_truncated(r)
    v = verify.judge(WL, "base", early, control=control())
    got = {c.name: c.status for c in v.checks}
    assert v.ok and got["log-matches-streams"] == "inconclusive" and got["all-slots-errored"] == "pass", got
    # not streamed (overflow-nonstream, a cold clean-clone run): the clients received no tokens,
    # only their answers, so the prefix says nothing; an error the log never shows says it ended early
    quiet = replace(early, outcomes=tuple(replace(o, tokens=(), token_t=()) for o in early.outcomes))
    assert measure.log_truncated(quiet)
    v = verify.judge(WL, "base", quiet, control=control())
    got = {c.name: c.status for c in v.checks}
    assert v.ok and got["log-matches-streams"] == "inconclusive" and got["all-slots-errored"] == "pass", got
    # the whole log, exit line removed: every error it shows, so nothing says it ended early
    whole = replace(r, trace=tuple(t for t in r.trace if t.kind != "exit"),
                    outcomes=tuple(replace(o, tokens=(), token_t=()) for o in r.outcomes))
    assert not measure.log_truncated(whole)


def test_a_request_handed_to_the_queue_between_the_bugs_errors_does_not_split_them():
    """The base fails every slot in one loop turn; a request the HTTP thread hands to the queue
    meanwhile (its "new task" line, between two errors: park-arrivals-3's arrival is sent when a
    request ends) is no step, and the turn stays one overflow that ended every slot."""
    r = sim(WL, patched=False)
    errors = [k for k, t in enumerate(r.trace) if t.kind == "error"]
    assert len(errors) == 4
    k = errors[1]
    trace = r.trace[:k] + (Trace("post", task=900),) + r.trace[k:] + (Trace("launch", 5, 900),)
    ev, = measure.overflows(replace(r, trace=trace), WL)
    assert ev.terminated == (0, 1, 2, 3) and not measure.evicts(replace(r, trace=trace), WL)


def test_a_start_with_a_timeout_is_not_made_again_for_its_shape(monkeypatch, tmp_path):
    """runner.run makes a start again while its designed shape is missed, but not one holding
    evidence (a timeout, a crash, a server exit): judged in any start, it fails the verdict, so
    another start would only wait out another hang."""
    from toolkit import runner

    ok = sim(WL)
    hung = replace(ok, outcomes=tuple(replace(o, outcome="timeout", error="no data for 120 s") if o.slot == 2 else o
                                      for o in ok.outcomes))
    made = []

    def once(binary, model, wl, path, **kw):
        made.append(path)
        return made_run
    monkeypatch.setattr(runner, "run_once", once)
    monkeypatch.setattr(measure, "shape", lambda r, wl, policy: "the designed shape missed")
    made_run = hung
    r = runner.run(tmp_path / "bin", tmp_path / "model", WL, tmp_path / "x.log", attempts=3, budget_s=60)
    assert len(made) == 1 and r.attempts == 1 and r.earlier == ()
    assert runner.evidence(hung) == "slot(s) [2] timed out or crashed" and runner.evidence(ok) == ""
    assert runner.evidence(replace(ok, exit_code=-11)) == "the server exited with -11"
    # the same start without the timeout is made again, up to its cap
    made.clear()
    made_run = ok
    r = runner.run(tmp_path / "bin", tmp_path / "model", WL, tmp_path / "x.log", attempts=3, budget_s=60)
    assert len(made) == 3 and r.attempts == 3 and len(r.earlier) == 2


def test_a_log_that_grows_while_no_request_receives_anything_is_a_flood(tmp_path):
    """runner.Flood: a server looping without progress floods its verbose log while no request
    receives anything; cut past QUIET_CAP of such growth, a hang costs a second of log. Growth
    with a reception between is progress, whatever the log's total (the backstop: LOG_CAP)."""
    from toolkit import runner

    log = tmp_path / "server.log"
    log.write_bytes(b"x" * 1000)
    flood = runner.Flood(log)
    assert flood(1.0) is None                                    # the baseline at this reception
    with open(log, "ab") as fh:
        fh.write(b"x" * (runner.QUIET_CAP - 10))
    assert flood(1.0) is None and flood.most == runner.QUIET_CAP - 10
    assert flood(2.0) is None                                    # a request received something: progress
    with open(log, "ab") as fh:
        fh.write(b"x" * (runner.QUIET_CAP + 1))
    why = flood(2.0)
    assert why and "while no request received anything" in why and flood.most == runner.QUIET_CAP + 1
    assert runner.Flood(tmp_path / "missing.log")(1.0) is None


def test_a_run_waits_for_the_log_to_write_its_last_requests_end(tmp_path):
    """Upstream's logger writes from a queue on its own thread and is never flushed at exit: a run
    reads the log only once it holds the end ("stop processing") of the last request the server
    launched (the follow-up, whose client saw it complete), so nothing before it is missing."""
    import threading

    from toolkit import record, runner

    head = ("0.1 I slot launch_slot_: id  0 | task 0 | processing task, is_child = 0\n"
            "0.2 I slot      release: id  0 | task 0 | stop processing: n_tokens = 16, truncated = 0\n"
            "0.3 I slot launch_slot_: id  1 | task 7 | processing task, is_child = 0\n"
            "0.4 D que  process_new_: processing task, id = 9\n")      # the queue's line: no launch
    end = "0.5 I slot      release: id  1 | task 7 | stop processing: n_tokens = 16, truncated = 0\n"
    assert record.last_request_ended(head) is False and record.last_request_ended(head + end) is True
    assert record.last_request_ended("a log without launches\n") is None          # nothing to wait for
    log = tmp_path / "server.log"
    log.write_text(head)
    later = threading.Timer(0.2, lambda: log.write_text(head + end))
    later.start()
    assert runner.caught_up(log, deadline_s=5.0)                   # waited for the logger, then read
    later.join()
    log.write_text(head)
    assert runner.caught_up(log, deadline_s=0.1) is False          # a last request never ended: bounded
