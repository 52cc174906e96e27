"""Upstream's test_completion_unified rule vs patchkit's verdict on the same four requests, on
hand-built outcomes and on runs of tests/fast/sim.py's forward model: no processes."""
from dataclasses import replace

from toolkit import compare, upstream_unified, verify
from toolkit.record import Outcome, Run
from toolkit.upstream_unified import CASE, compare_runs, upstream_rule
from toolkit.workload import load

from .sim import EXC, simulate

WL = load(upstream_unified.WORKLOAD)


def out(slot, status, n_predict=70, predicted=None, content=None):
    """One non-streamed /completion exchange as the runner records it."""
    ok = status == 200
    got = n_predict if predicted is None else predicted
    return Outcome(slot, "completed" if ok else "errored", status, None if ok else EXC, ok, "limit" if ok else None,
                   False if ok else None, got if ok else None, tuple(range(got)) if ok else (), 1, n_predict,
                   0.0, 0.01 if ok else None, 0.02, has_content=ok if content is None else content,
                   predicted_n=got if ok else None)


ALL_FAIL = tuple(out(s, 500) for s in range(4))                      # the base: the bug
ONE_VICTIM = tuple(out(s, 500 if s == 1 else 200) for s in range(4))  # the patched server


def test_workload_is_upstreams_case():
    """Same pool, slots, unified flag and n_predict values as upstream's overflowing case, non-streamed."""
    assert (WL.server.ctx, WL.server.parallel, WL.server.kv_unified) == (CASE.n_ctx, CASE.n_slots, True)
    assert tuple(r.n_predict for r in WL.requests) == CASE.n_predict
    assert not any(r.stream for r in WL.requests)
    assert CASE.expected_success == (False,) * 4
    assert WL.expect.base == "all-error" and WL.expect.candidate == "one-victim" and WL.expect.victim == 1


def test_upstream_rule_passes_the_bug_and_the_fix_alike():
    bug, fix = upstream_rule(ALL_FAIL, CASE.expected_success), upstream_rule(ONE_VICTIM, CASE.expected_success)
    assert bug.ok and bug.asserted == 0, bug       # nothing asserted at all: every request failed, as allowed
    assert fix.ok and fix.asserted == 6, fix       # 3 x (content, predicted_n == n_predict)


def test_upstream_rule_can_fail():
    """The rule is applied as written, not as a constant: each of its assertions fails on its case."""
    short = tuple(replace(o, predicted_n=69) if o.slot == 2 else o for o in ONE_VICTIM)
    r = upstream_rule(short, CASE.expected_success)
    assert not r.ok and "slot 2: predicted_n 69 != n_predict 70" in r.detail
    r = upstream_rule(ALL_FAIL, (True, True, True, True))   # upstream's first case expects all four to succeed
    assert not r.ok and "slot 0: expected success, got HTTP 500" in r.detail
    r = upstream_rule(tuple(out(s, 200, content=s != 3) for s in range(4)), CASE.expected_success)
    assert not r.ok and 'slot 3: HTTP 200 without "content"' in r.detail
    # no timings in a 200 body: upstream skips the predicted_n assertion
    r = upstream_rule(tuple(replace(o, predicted_n=None) for o in ONE_VICTIM), CASE.expected_success)
    assert r.ok and r.asserted == 3


def nonstream(run: Run) -> Run:
    """sim's runs as the non-streamed exchange records them: a terminated request gets HTTP 500 and no
    tokens; a completed one HTTP 200 with its content and timings.predicted_n."""
    return replace(run, outcomes=tuple(
        replace(o, http_status=500, tokens=(), token_t=()) if o.outcome == "errored"
        else replace(o, has_content=True, predicted_n=len(o.tokens)) for o in run.outcomes))


def sim(patched, pool=WL.server.ctx):
    return nonstream(simulate([len(r.prompt) for r in WL.requests], list(CASE.n_predict), pool, patched=patched))


def side_by_side(base: Run, cand: Run):
    control = sim(False, pool=1024)
    verdicts = (verify.judge(WL, "base", base, 0), verify.judge(WL, "candidate", cand, 0, control, base=base))
    return compare_runs(WL, (base,), (cand,), verdicts)


def test_patchkit_separates_what_upstream_passes_alike():
    base, cand = sim(False), sim(True)
    assert [o.http_status for o in base.outcomes] == [500] * 4
    assert [o.http_status for o in cand.outcomes] == [200, 500, 200, 200]
    cmp = side_by_side(base, cand)
    assert cmp.upstream_passes_both
    assert cmp.patchkit_separates
    b, c = cmp.sides
    assert (b.side, c.side) == ("base", "candidate")
    assert b.patchkit_ok and {x.name: x.status for x in b.patchkit} == {"all-slots-errored": "pass"}
    # the base's runs, judged as a fix would be, fail patchkit's eviction expectations
    as_fix = {x.name: x.status for x in b.as_candidate}
    assert as_fix["one-victim-per-overflow"] == as_fix["victim-is-largest"] == as_fix["survivors-complete"] == "fail"
    assert c.patchkit_ok, [(x.name, x.detail) for x in c.patchkit if not x.ok]
    checks = {x.name: x for x in c.patchkit}
    assert checks["victim-is-largest"].status == "pass" and "terminated [1]" in checks["victim-is-largest"].detail
    assert checks["survivors-complete"].status == "pass" and checks["integrity"].status == "pass"


def test_a_fix_that_changes_nothing_passes_upstream_not_patchkit():
    """A candidate that still errors every slot: upstream's rule passes it, patchkit's verdict fails it."""
    base = sim(False)
    cmp = side_by_side(base, base)
    assert cmp.upstream_passes_both
    assert not cmp.patchkit_separates
    cand = next(s for s in cmp.sides if s.side == "candidate")
    assert not cand.patchkit_ok
    assert {x.name for x in cand.patchkit if x.status == "fail"} >= {"one-victim-per-overflow", "survivors-complete"}


def test_a_wrong_victim_passes_upstream_not_patchkit():
    """The patch's tie-break slot (0) terminated instead of the largest (1): upstream's rule cannot see it."""
    cand = nonstream(simulate([len(r.prompt) for r in WL.requests], list(CASE.n_predict), WL.server.ctx,
                              key=lambda slot: -slot))
    assert [o.http_status for o in cand.outcomes] == [500, 200, 200, 200]
    cmp = side_by_side(sim(False), cand)
    assert cmp.upstream_passes_both and not cmp.patchkit_separates
    c = next(s for s in cmp.sides if s.side == "candidate")
    assert {x.name: x.status for x in c.patchkit}["victim-is-largest"] == "fail"
