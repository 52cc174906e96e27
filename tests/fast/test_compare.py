"""Expectations and oracles on recorded outcome data: no processes."""
from toolkit import compare
from toolkit.workload import Event, Outcome, Run, load

EXC = compare.EXCEEDED


def out(slot, kind="completed", n=240, tokens=None, error=None, n_predict=240):
    toks = tuple(tokens if tokens is not None else range(100 + slot, 100 + slot + n))
    return Outcome(slot, kind, 200, error, kind == "completed", "limit" if kind == "completed" else None, False,
                   len(toks) if kind == "completed" else None, toks, 40, n_predict, 0.0, 0.01, 0.2)


def run(outcomes, events=(), alive=True, followup=True, code=None):
    return Run("w", tuple(outcomes), (), tuple(events), alive, followup, code, 0.3, "log")


WL = load("overflow-4")


def control():
    return run([out(s) for s in range(4)])


def patched_ok():
    return run([out(0), out(1), out(2), out(3, "errored", n=187, error=EXC)],
               [Event("evict", 0, 3, 287, ((0, 227), (1, 247), (2, 267)))])


def test_base_bug_reproduced():
    v = compare.judge(WL, "base", run([out(s, "errored", n=187, error=EXC) for s in range(4)],
                                      [Event("error-all", 1)]))
    assert v.ok


def test_base_without_bug_fails():
    v = compare.judge(WL, "base", control())
    assert not v.ok and [c.name for c in v.checks if c.status == "fail"] == ["all-slots-errored"]


def test_candidate_passes_with_evidence():
    v = compare.judge(WL, "candidate", patched_ok(), control=control())
    assert v.ok, [c for c in v.checks if not c.ok]


def test_start_not_in_lock_step_fails_the_verdict():
    from dataclasses import replace
    r = replace(patched_ok(), attempts=20, launch_spread_ms=3.2)
    v = compare.judge(WL, "candidate", r, control=control())
    failed = [c for c in v.checks if c.status == "fail"]
    assert [c.name for c in failed] == ["lock-step"] and "20 attempts" in failed[0].detail
    assert compare.judge(WL, "candidate", replace(r, launch_spread_ms=0.4), control=control()).ok


def test_wrong_victim_is_caught():
    r = run([out(0), out(1), out(2, "errored", n=187, error=EXC), out(3)],
            [Event("evict", 0, 2, 267, ((0, 227), (1, 247), (3, 287)))])
    failed = {c.name for c in compare.judge(WL, "candidate", r, control=control()).checks if c.status == "fail"}
    assert failed == {"victim-is-largest", "victim-as-sized"}


def test_two_victims_for_one_event_fail():
    r = run([out(0), out(1), out(2, "errored", n=187, error=EXC), out(3, "errored", n=187, error=EXC)],
            [Event("evict", 0, 3, 287, ((0, 227), (1, 247), (2, 267)))])
    failed = {c.name for c in compare.judge(WL, "candidate", r, control=control()).checks if c.status == "fail"}
    assert "one-victim-per-event" in failed


def test_short_survivor_fails():
    r = run([out(0), out(1, "truncated", n=200), out(2), out(3, "errored", n=187, error=EXC)],
            [Event("evict", 0, 3, 287, ((0, 227), (1, 247), (2, 267)))])
    failed = {c.name for c in compare.judge(WL, "candidate", r).checks if c.status == "fail"}
    assert "survivors-complete" in failed


def test_integrity_reports_first_difference():
    bad = list(range(101, 341))
    bad[187] = 9
    r = run([out(0), out(1, tokens=bad), out(2), out(3, "errored", n=187, error=EXC)],
            [Event("evict", 0, 3, 287, ((0, 227), (1, 247), (2, 267)))])
    checks = {c.name: c for c in compare.judge(WL, "candidate", r, control=control()).checks}
    assert checks["integrity"].status == "fail"
    assert "slot 1: differs from control at token 187" in checks["integrity"].detail


def test_victim_must_be_prefix_of_control():
    victim = list(range(103, 103 + 187))
    victim[5] = 0
    r = run([out(0), out(1), out(2), out(3, "errored", tokens=victim, error=EXC)],
            [Event("evict", 0, 3, 287, ((0, 227), (1, 247), (2, 267)))])
    checks = {c.name: c for c in compare.judge(WL, "candidate", r, control=control()).checks}
    assert checks["integrity"].status == "fail" and "victim" in checks["integrity"].detail


def test_dead_server_fails_even_if_outcomes_look_fine():
    r = run(patched_ok().outcomes, patched_ok().events, alive=False, followup=False, code=-11)
    failed = {c.name for c in compare.judge(WL, "candidate", r).checks if c.status == "fail"}
    assert {"no-crash", "serves-after"} <= failed


def test_no_control_is_skip_not_pass():
    checks = {c.name: c for c in compare.judge(WL, "candidate", patched_ok()).checks}
    assert checks["integrity"].status == "skip"


def test_same_as_base():
    wl = load("single-slot")
    base = run([out(0, "truncated", n=156)])
    assert compare.judge(wl, "candidate", run([out(0, "truncated", n=156)]), base=base).ok
    assert not compare.judge(wl, "candidate", run([out(0, "truncated", n=150)]), base=base).ok


def test_first_difference():
    assert compare.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert compare.first_difference([1, 2], [1, 2, 3]) == 2
    assert compare.first_difference([1, 5, 3], [1, 2, 3]) == 1


def test_goodput_of_nothing_is_none():
    assert compare.goodput([]) is None
    g = compare.goodput([patched_ok()])
    assert (g.tokens, g.completed, g.requests) == (240 * 3 + 187, 3, 4)


def test_policies():
    ev = Event("evict", 0, 3, 287, ((0, 227), (1, 247), (2, 267)))
    assert compare.expected_victim(ev, "largest", WL) == {3}
    assert compare.expected_victim(ev, "smallest", WL) == {0}


def test_sanitizer_findings_fail_the_run():
    from toolkit.workload import sanitizer_findings
    log = ("0.01 W srv ...\n==123==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x6020\n"
           "server-context.cpp:3650:17: runtime error: index 9 out of bounds for type 'int [8]'\n")
    found = sanitizer_findings(log)
    assert len(found) == 2 and "heap-buffer-overflow" in found[0]
    r = patched_ok()
    dirty = Run(r.workload, r.outcomes, r.samples, r.events, True, True, None, 0.3, "log", sanitizer=found)
    checks = {c.name: c for c in compare.judge(WL, "candidate", dirty).checks}
    assert checks["no-sanitizer-findings"].status == "fail" and "2 finding(s)" in checks["no-sanitizer-findings"].detail
    assert sanitizer_findings("all good\n") == ()
