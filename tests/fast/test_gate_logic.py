"""The gate's pure parts: no-regression, which expectations apply (and why), the nightly's
add/add resolver, the shard matrix, merging shards' gate.json, the step summary."""
from dataclasses import replace

import pytest

from toolkit import compare, gate, mix, verify
from toolkit.errors import ReportError
from toolkit.verify import expectations
from toolkit.workload import load

from .sim import EXC, simulate

WL = load("overflow-4")
FITS = load("fits")


def sim(wl, **kw):
    return simulate([len(r.prompt) for r in wl.requests], 240, wl.server.ctx, **kw)


def with_outcome(run, slot, **kw):
    return replace(run, outcomes=tuple(replace(o, **kw) if o.slot == slot else o for o in run.outcomes))


def test_no_regression_passes_an_improvement_and_names_a_lost_survivor():
    before, after = sim(WL, patched=False), sim(WL)
    c, = compare.no_regression(after, before, WL)
    assert c.status == "pass" and "better" in c.detail
    # a survivor that completed before and stops at 200 tokens now
    ref = sim(WL)
    cut = with_outcome(ref, 1, outcome="truncated", tokens=ref.outcomes[1].tokens[:200])
    c, = compare.no_regression(cut, ref, WL)
    assert c.status == "fail" and "slot 1: completed (240 tokens) -> truncated (200 tokens)" in c.detail
    # same outcome, different tokens: fails on the tiny models, only reported on a real model
    bad = with_outcome(ref, 2, tokens=(7,) + ref.outcomes[2].tokens[1:])
    assert compare.no_regression(bad, ref, WL)[0].detail == "slot 2: tokens differ from the before side at token 0"
    text = load("text-overflow-4")
    assert compare.no_regression(bad, ref, text)[0].status == "pass"


def test_a_crash_or_timeout_is_a_regression_even_from_an_error():
    before = sim(WL, patched=False)
    after = with_outcome(before, 0, outcome="timeout")
    c, = compare.no_regression(after, before, WL)
    assert c.status == "fail" and "slot 0: errored" in c.detail and "-> timeout" in c.detail


def test_expectations_are_measured_not_assumed():
    evicting, bug = sim(WL), sim(WL, patched=False)
    applied, why, base_ev = expectations("auto", [(WL, [bug], [evicting])])
    assert (applied, base_ev) == ("eviction", False) and "measured" in why and "overflow-4" in why
    applied, why, base_ev = expectations("auto", [(WL, [bug], [bug])])
    assert applied == "no-regression" and "does not evict" in why
    applied, why, base_ev = expectations("auto", [(WL, [evicting], [evicting])])
    assert applied == "eviction" and base_ev and "already evicts" in why
    assert expectations("no-regression", [(WL, [bug], [evicting])])[0] == "no-regression"
    assert expectations("auto", [(WL, [bug], [bug])], "patch evict-largest-slot")[0] == "eviction"
    assert expectations("auto", [(WL, [bug], [])])[1] == "baseline only: the base must show the bug"


def test_judge_uses_the_base_as_reference_when_asked():
    before, after = sim(WL), sim(WL)
    v = verify.judge(WL, "base", before, base_reference=True)
    assert [c.name for c in v.checks][1:] == ["reference"] and v.ok
    v = verify.judge(WL, "candidate", after, base=before, base_reference=True, control=sim(WL, patched=False))
    names = [c.name for c in v.checks]
    assert "no-regression" in names and "victim-is-largest" in names
    v = verify.judge(FITS, "candidate", sim(FITS), base=sim(FITS), expect="no-regression")
    assert {c.name for c in v.checks} >= {"no-regression", "no-crash"} and "all-completed" not in {c.name for c in v.checks}


def test_on_an_evicting_base_another_largest_victim_is_no_regression_but_a_second_victim_is():
    """Measured in a warm CI run: a harmless pin on a base that already evicts ended slot 2 (prompt
    80) where the base had ended slot 3 (prompt 100): slot 3's prefill came a few steps later, so
    slot 2 held the most cells at the overflow. Which slot is the largest is timing; that the
    victim is the largest is judged by victim-is-largest, so no-regression excuses it, once."""
    before = sim(WL)                                 # the base evicts its largest, slot 3
    after = sim(WL, launch=[0, 0, 0, 40])            # slot 3 starts 40 steps late: slot 2 is the largest
    assert [o.slot for o in before.outcomes if o.outcome == "errored"] == [3]
    assert [o.slot for o in after.outcomes if o.outcome == "errored"] == [2]
    v = verify.judge(WL, "candidate", after, base=before, base_reference=True, control=sim(WL, patched=False))
    checks = {c.name: c for c in v.checks}
    assert checks["victim-is-largest"].status == "pass", checks["victim-is-largest"].detail
    assert checks["no-regression"].status == "pass" and "victim here is slot 2" in checks["no-regression"].detail
    # the no-regression expectation (asked for) excuses it the same way: the measured largest
    v = verify.judge(WL, "candidate", after, base=before, expect="no-regression")
    assert {c.name: c.status for c in v.checks}["no-regression"] == "pass"
    # without the candidate's measured victims it is a regression
    c, = compare.no_regression(after, before, WL)
    assert c.status == "fail" and "slot 2: completed (240 tokens) -> errored" in c.detail
    # a candidate ending more requests than the before side did is not excused, victims or not
    two = with_outcome(after, 1, outcome="errored", tokens=after.outcomes[1].tokens[:150], error=EXC)
    c, = compare.no_regression(two, before, WL, frozenset({1, 2}))
    assert c.status == "fail" and "slot 1: completed" in c.detail and "slot 2: completed" in c.detail
    # a victim outside the policy's choice is not excused: the runner-up ended instead of the largest
    wrong = sim(WL, lie=True)
    v = verify.judge(WL, "candidate", wrong, base=before, base_reference=True, control=sim(WL, patched=False))
    checks = {c.name: c for c in v.checks}
    assert checks["victim-is-largest"].status == "fail" and checks["no-regression"].status == "fail"


@pytest.mark.parametrize("text,expected", [
    ("a\n<<<<<<< x\nA\n||||||| b\n=======\nB\n>>>>>>> y\nz\n", "a\nA\nB\nz\n"),
    ("<<<<<<< x\nA\n||||||| b\nold\n=======\nB\n>>>>>>> y\n", None),       # both changed a base line
    ("<<<<<<< x\nA\n=======\nB\n>>>>>>> y\n", None),                        # not diff3: cannot tell
    ("no conflict\n", "no conflict\n"),
])
def test_the_nightlys_resolver_keeps_only_pure_additions(text, expected):
    assert mix._resolve_pure_adds(text) == expected


def test_plan_is_one_shard_per_workload_and_repeat():
    p = gate.plan(base="b1", old_text=None, new_text='{"prs": []}', workloads=["overflow-4", "fits"], repeat=2,
                  sanitize="address,undefined")
    assert [m["name"] for m in p["include"]] == ["overflow-4 #1", "overflow-4 #2", "fits #1", "fits #2",
                                                  "sanitize address,undefined"]
    assert p["include"][-1] == {"name": "sanitize address,undefined", "workloads": "overflow-4,fits",
                                "sanitize": "address,undefined", "upstream": ""}
    # upstream's server tests: one more shard, which runs no workload
    u = gate.plan(base="b1", old_text=None, new_text='{"prs": []}', workloads=["overflow-4"], repeat=1,
                  sanitize=None, upstream_tests=("ci",))
    assert u["include"][-1] == {"name": "upstream tests ci", "workloads": gate.NO_WORKLOADS, "sanitize": "",
                                "upstream": "ci"}
    assert p["key"] != gate.plan(base="b2", old_text=None, new_text='{"prs": []}', workloads=None, repeat=1,
                                 sanitize=None)["key"]


def _shard(name, ok, wl, failed=(), culprits=(), commit="c" * 40):
    side = {"base": "b" * 40, "commit": commit, "failure": None,
            "steps": [{"pin": "ggml-org/llama.cpp#7", "url": "u7", "required": True, "action": "merged",
                       "commit": commit, "note": ""}]}
    return {"schema": 1, "ok": ok, "builds": True, "shards": [name], "before": {**side, "commit": "b" * 40, "steps": []},
            "after": side, "changed": [{"pin": "ggml-org/llama.cpp#7", "url": "https://x/commits/" + "7" * 40}], "expect": "eviction", "expect_why": "measured",
            "culprits": [{"pin": c, "url": "u7"} for c in culprits], "blame": [], "note": "",
            "workloads": {wl: {"ok": ok, "prompts": [40, 60], "before": [[[0, "errored", 10, 240, "E"]]],
                               "after": [[[0, "completed", 240, 240, ""]]], "failed": list(failed)}}}


def test_merge_unites_shards_and_any_failure_fails():
    a = _shard("overflow-4 #1", True, "overflow-4")
    b = _shard("overflow-4 #2", False, "overflow-4", ["overflow-4 after#0 integrity: x"], ["ggml-org/llama.cpp#7"])
    m = gate.merge([a, b])
    assert not m["ok"] and m["shards"] == ["overflow-4 #1", "overflow-4 #2"]
    assert len(m["workloads"]["overflow-4"]["after"]) == 2 and m["workloads"]["overflow-4"]["failed"]
    assert [c["pin"] for c in m["culprits"]] == ["ggml-org/llama.cpp#7"]
    md = gate.summary_md(m)
    assert md.startswith("## patchkit pin gate: FAIL") and "responsible pin**: ggml-org/llama.cpp#7" in md
    assert "| overflow-4 **FAIL** | 1 | 0 | 40 | errored 10/240 | completed 240/240 | before: E |" in md
    assert "added or moved pins**: ggml-org/llama.cpp#7 at `777777777777`" in md
    with pytest.raises(ReportError, match="different after mixes"):
        gate.merge([a, _shard("fits #1", True, "fits", commit="d" * 40)])


def test_merge_keeps_the_upstream_shard_and_the_summary_names_its_regression():
    up = {"ok": False, "tests": ["ci"], "counts": {"run": 24, "passed_before": 22, "passed_after": 21,
          "regressions": 1, "gained": 0, "not_judged": 2, "not_run": 0, "flaky": 0}, "not_run_reasons": {},
          "regressions": [{"id": "unit.test_tokenize::test_tokenize_detokenize", "message": "assert 'a' == 'b'"}]}
    a = _shard("overflow-4 #1", True, "overflow-4")
    b = {**_shard("upstream tests ci", False, "overflow-4"), "workloads": {}, "upstream": up,
         "culprits": [{"pin": "ggml-org/llama.cpp#7", "url": "u7"}]}
    m = gate.merge([a, b])
    assert not m["ok"] and m["upstream"] == up and [c["pin"] for c in m["culprits"]] == ["ggml-org/llama.cpp#7"]
    md = gate.summary_md(m)
    assert "**llama.cpp server tests** (ci): FAIL; run 24, passed before 22, passed after 21, regressions 1" in md
    assert "REGRESSION unit.test_tokenize::test_tokenize_detokenize: assert 'a' == 'b'" in md
