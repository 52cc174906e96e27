"""Issue 28: patchkit's park and recompute hold at the edge, and right patches by other designs pass.

- park-whole-pool: a slot parked holding more than the pool less a running slot's headroom comes
  back once it is alone (the resume asked for that headroom always: it never came back);
- many-resumes-8: requests parked again and again (18 parks per run by the park rules), every
  resume judged exact, and a request parked 3 times passed over while another can go;
- park-starvation-7: one request the largest at every overflow, so a 4th park of it is arithmetic
  (300 simulated runs with jittered starts, bench/park_schedule.py), not the run's step alignment
  as in many-resumes-8 (ALIVE there in 1 of 6 runs): the broken variant parks-unbounded dies here;
- hybrid-slot: swap within a budget of parked bytes, recompute above it (LLAMA_ARG_PREEMPT_RAM=0:
  every park recomputed);
- park-beside-family: nobody left to park (an n_cmpl family outgrows the pool alone) while a slot
  is parked: upstream's all-slots error must not reach the parked slot (variant parked-not-spared);
- recompute-prefill-slot: the pending sampled token re-prefilled with the history, its successor
  sampled on resume (one cell more than at the park): a right design that must pass;
- lora-resume-3: a slot with a LoRA adapter recomputed after another task's batches set none: the
  recompute must decode with the slot's own adapters (variant lora-stale: only the stream sees it);
- park-arrivals-3: a request that arrives while one is parked waits until it is back (variant
  arrivals-first: upstream's admission lets it go ahead; only parked-first sees it).
Each broken variant is killed by the check written for it, for its reason."""
import re

import git
import pytest

from toolkit import apply, measure, pauses, report, source, verify, workload
from toolkit.ui import UI

from .conftest import broken_variant

POOL = 1024  # park-whole-pool's -c
HEADROOM = 16


def judge(tree, tmp_path, patch_name, names, env=None):
    repo = git.Repo(tree.path)
    if env is None:
        return verify.verify(repo, base_ref=source.BASELINE_TAG, patch_name=patch_name,
                             workloads=[workload.load(n) for n in names], out_dir=tmp_path, ui=UI(quiet=True))
    base = source.resolve(repo, source.BASELINE_TAG)
    cand, _ = apply.candidate_commit(repo, base, patch_name)
    return verify.run_suite(repo, base, cand, [workload.load(n) for n in names], work_dir=tmp_path,
                            candidate_label=f"patch {patch_name}", evicting_patch=True, patch_expect="preemption",
                            candidate_env=env, say=lambda s: None, family=patch_name)


def failures(res):
    return [(v.workload, c.name, c.detail) for r in res.results for v in r.verdicts for c in v.checks
            if c.status == "fail"]


def checks(wr):
    return {c.name: c for v in wr.verdicts if v.side == "candidate" for c in v.checks}


def broken(c2, tmp_path, patch_name, variant, wl):
    return broken_variant(c2, tmp_path, patch_name, variant, wl)


@pytest.mark.parametrize("family", ["park-slot", "recompute-slot", "hybrid-slot"])
def test_a_slot_parked_holding_nearly_the_whole_pool_comes_back_alone(c2, c2_base, tmp_path, family):
    res = judge(c2, tmp_path, family, ["park-whole-pool"])
    assert res.expect == "preemption" and res.ok, failures(res)
    wr = res.results[0]
    assert all(o.outcome == "errored" for o in wr.base[0].outcomes)            # the bug, on the base
    ps = measure.pauses(wr.candidate[0])
    assert list(ps) == [0] and ps[0][0].resumed, ps
    assert ps[0][0].cells_before > POOL - HEADROOM, ps                          # the edge was reached
    assert all(o.outcome == "completed" for o in wr.candidate[0].outcomes)


def test_a_resume_that_always_asks_for_headroom_never_comes_back(c2, c2_base, tmp_path):
    """park-slot's variant (recompute-slot's, the same edit, is caught the same way: docs/commands.md;
    one TU fewer in CI)."""
    k = broken(c2, tmp_path, "park-slot", "headroom-when-alone", "park-whole-pool")
    assert "slot 0 paused at token" in k["waits-bounded"] and "never resumed" in k["waits-bounded"], k


def test_a_resume_tried_lazily_is_seen_only_by_the_wait_bound(c2, c2_base, tmp_path):
    """resume-lazy: the resume tried every 1000th step. Every request completes and every stream is
    exact (it comes back from the same token); alone, slot 0 waits through steps where nothing runs,
    and only waits-bounded says so (its own mutant: headroom-when-alone is caught by three checks)."""
    k = broken(c2, tmp_path, "park-slot", "resume-lazy", "park-whole-pool")
    assert set(k) == {"waits-bounded"}, k
    assert re.search(r"slot 0 paused at token \d+: \d+ step\(s\) with nothing running \(bound 2\)", k["waits-bounded"]), k


def test_many_resumes_are_each_judged_and_the_starvation_bound_holds(c2, c2_base, tmp_path):
    res = judge(c2, tmp_path, "park-slot", ["many-resumes-8"])
    assert res.ok, failures(res)
    c = checks(res.results[0])
    n = int(c["streams-exact"].detail.split(": ")[-1].split()[0])
    assert n >= 12, c["streams-exact"].detail                                   # 18 by the park rules' arithmetic
    most = int(c["parks-bounded"].detail.rsplit("most parks of one request: ", 1)[1].rstrip(")"))
    # a request parked again. More than 3 parks keeps the promise when nobody parked fewer times
    # generated beside it, which parks-bounded judges (a CI run under load measured 4, passed by it):
    # a bound on the count here would be a bet on timing
    assert c["parks-bounded"].status == "pass" and most >= 2, c["parks-bounded"].detail


def test_hybrid_above_its_budget_recomputes_and_keeps_every_promise(c2, c2_base, tmp_path):
    """LLAMA_ARG_PREEMPT_RAM=0: no byte may stay in host memory, so every park is recomputed."""
    res = judge(c2, tmp_path, "hybrid-slot", ["overflow-4", "park-whole-pool"], env={"LLAMA_ARG_PREEMPT_RAM": "0"})
    assert res.ok, failures(res)
    assert all(measure.parks(wr.candidate[0]) for wr in res.results)
    for wr in res.results:   # measured, not the patch's word: no sequence was read back from host memory
        assert checks(wr)["resume-path"].status == "pass" and "recomputed" in checks(wr)["resume-path"].detail
        assert not any(p.restored for v in measure.pauses(wr.candidate[0]).values() for p in v)


def test_a_recompute_that_prefills_its_pending_token_passes(c2, c2_base, tmp_path):
    """The fork's design: it comes back holding one cell more than at the park (the pending token,
    decoded with the history), and every stream is still exact. The check judges that property.
    victim-decoded parks a slot whose entry was decoded before the pool ran out: its pending token
    is then one it sampled in the park's step, decoded by the resume with no entry line of its own
    (one-sample-per-entry said "no entry for it", INCONCLUSIVE, before it read the resume's sample)."""
    res = judge(c2, tmp_path, "recompute-prefill-slot", ["overflow-4", "preempt-penalty-4", "victim-decoded"])
    assert res.ok, failures(res)
    for wr in res.results:
        ps = [p for v in measure.pauses(wr.candidate[0]).values() for p in v]
        assert ps and all(p.resumed and p.cells == p.cells_before + 1 for p in ps), ps
        assert checks(wr)["resumes-where-paused"].status == "pass"
        assert checks(wr)["one-sample-per-entry"].status == "pass", checks(wr)["one-sample-per-entry"].detail
    assert res.outcome == "PASS", report.summary_line(res)


def test_a_request_parked_again_and_again_is_passed_over_after_its_third_park(c2, c2_base, tmp_path):
    res = judge(c2, tmp_path, "park-slot", ["park-starvation-7"])
    assert res.ok, failures(res)
    c = checks(res.results[0])
    assert c["parks-bounded"].detail.endswith("(most parks of one request: 3)"), c["parks-bounded"].detail
    parks = {s: len(v) for s, v in measure.pauses(res.results[0].candidate[0]).items()}
    assert parks == {0: 3, 4: 2}, parks           # the bound passed slot 0 over: slot 4 parked instead


def test_without_the_bound_the_largest_is_parked_a_fourth_time(c2, c2_base, tmp_path):
    k = broken(c2, tmp_path, "park-slot", "parks-unbounded", "park-starvation-7")
    assert set(k) == {"parks-bounded"}, k          # every request completes, every stream exact
    assert "slot 0 parked a 4th time at step" in k["parks-bounded"] and "(0 park(s))" in k["parks-bounded"], k


@pytest.mark.parametrize("variant,why", [
    ("budget-ignored", "was read back from host memory (upstream's state reader) although its series keeps nothing"),
    ("never-swapped", "came back without its sequence read back from host memory"),
])
def test_the_budgets_path_is_read_from_llamas_state_reader(c2, c2_base, tmp_path, variant, why):
    """hybrid-slot's two ways to get the budget wrong keep every other promise (a swap and a
    recompute are both right): only resume-path, from llama.cpp's own "state_read_meta" line, sees
    which path a park took. budget-ignored is judged under LLAMA_ARG_PREEMPT_RAM=0 (its patch.toml env)."""
    k = broken(c2, tmp_path, "hybrid-slot", variant, "overflow-4")
    assert set(k) == {"resume-path"} and why in k["resume-path"], k


def test_a_parked_request_is_spared_when_nobody_is_left_to_park(c2, c2_base, tmp_path):
    """park-beside-family: slot 2 is parked (a family member never is); the n_cmpl family then
    outgrows the pool alone, and upstream fails every processing slot, a parked one included. The
    family needs more than the whole pool (excused its context error); slot 2 must come back."""
    res = judge(c2, tmp_path, "park-slot", ["park-beside-family"])
    assert res.ok, failures(res)
    outs = {o.slot: o for o in res.results[0].candidate[0].outcomes}
    assert outs[0].outcome == "errored" and outs[2].outcome == "completed", outs
    assert [p.resumed for p in measure.pauses(res.results[0].candidate[0])[2]] == [True]
    assert "slot 0 is an n_cmpl = 2 family bigger than the pool together" in checks(res.results[0])["no-request-fails"].detail
    k = broken(c2, tmp_path / "v", "park-slot", "parked-not-spared", "park-beside-family")
    assert re.search(r"slot 2: errored after \d+/300 tokens \(Context size has been exceeded\.\)",
                     k["no-request-fails"]), k


def test_the_preemption_states_run_clean_under_asan_and_ubsan(c2, c2_base, tmp_path):
    """Issue 36 item 4: the new states under the sanitizers, once. hybrid-slot holds both resume
    paths in one binary (no budget: every park swapped; LLAMA_ARG_PREEMPT_RAM=0: every park
    recomputed), built with ASan+UBSan on the TU the patch changes and the KV cache it frees cells
    in. Runs: a park (overflow-4), parks again and again (many-resumes-8), a parked slot spared
    beside an n_cmpl family that outgrows the pool alone (park-beside-family) and a parked slot with
    a LoRA adapter resumed after a task without one (lora-resume-3) and a request queued while one is
    parked, handed on at its resume (park-arrivals-3). Zero findings, and every preemption check
    still holds."""
    from toolkit import model, promises, runner
    from .conftest import sanitized_build

    repo = git.Repo(c2.path)
    sha, _ = apply.candidate_commit(repo, source.resolve(repo, source.BASELINE_TAG), "hybrid-slot")
    binary = sanitized_build(c2, sha)["binary"]
    seen = set()
    for budget in (None, "0"):
        env = {"LLAMA_ARG_PREEMPT_RAM": budget} if budget else None
        own = promises.of_family("hybrid-slot", "largest", "x", env).own
        for name in ("overflow-4", "many-resumes-8", "park-beside-family", "lora-resume-3", "park-arrivals-3"):
            wl = workload.load(name)
            r = runner.run(binary, model.resolve(wl.model, lambda s: None).path, wl, tmp_path / f"{name}.{budget}.log",
                           probe_pool=True, env=env)
            assert r.sanitized == ("address", "undefined") and not r.sanitizer, (name, budget, r.sanitizer)
            v = verify.judge(wl, "candidate", r, expect="preemption", own=own)
            assert not [c for c in v.checks if c.status == "fail"], (name, budget, [(c.name, c.detail) for c in v.checks
                                                                                   if c.status == "fail"])
            seen |= {("swap" if p.restored else "recompute") for ps in measure.pauses(r).values() for p in ps}
            if name == "park-arrivals-3":   # the deferred task handed on by the resume ran, checked
                seen |= {c.name for c in v.checks if c.name == "parked-first" and c.status == "pass"}
    assert seen == {"swap", "recompute", "parked-first"}   # both resume paths and the hand-on ran under the sanitizers


@pytest.mark.parametrize("version", [source.DEFAULT_VERSION, "0.3.36"])   # C2, D
def test_a_parked_slot_with_a_lora_adapter_is_skipped_by_the_batch_and_recomputed_with_its_own(
        trees, tmp_path, version):
    """lora-resume-3 (issue 36): slots 0 and 1 with the witness's LoRA adapter, slot 2 without.
    Parked holding nearly the whole pool, slot 0 can come back only after slot 2 has run alone.
    Two findings reached: a parked slot must not become the batch's first slot (slot 2, with other
    adapters, would wait behind it for ever: parked-batched), and the recompute must decode with
    the slot's own adapters, not the last batch's (lora-stale: only the stream sees it). Reached,
    measured from upstream's log: slot 2 decoded between slot 0's park and its resume."""
    tree = trees(version)

    def reached(res):   # slot 2 decoded between slot 0's park and its resume
        run = res.results[0].candidate[0]
        ps = measure.pauses(run)
        assert list(ps) == [0] and ps[0][0].resumed, ps
        entries = pauses._entries(run)[0]
        parked = ps[0][0].step
        back = min(step for step, _, _ in entries[0] if step > parked)
        return any(parked < step < back for step, _, _ in entries[2]), (parked, back, entries[2][:3])
    # slot 2 decoded inside the park is the workload's designed shape (expect.shape): a start that
    # missed it (slot 2 posted after the park by a descheduled client) is made again by the runner
    res = judge(tree, tmp_path, "recompute-slot", ["lora-resume-3"])
    assert res.ok, failures(res)
    ok, where = reached(res)
    assert ok, where
    shape = checks(res.results[0])["designed-shape"]
    assert shape.status == "pass" and "slot 2 (other adapters) decoded while slot 0 was parked" in shape.detail, shape
    # judged on its shape: killed in a start that reached it, never ALIVE on a start that missed it
    k = broken_variant(tree, tmp_path / "stale", "recompute-slot", "lora-stale", "lora-resume-3")
    assert set(k) == {"streams-exact"} and "slot 0: differs from its control at token" in k["streams-exact"], k
    if version == source.DEFAULT_VERSION:   # the same surgery on D; one TU fewer in CI
        k = broken(tree, tmp_path / "batched", "park-slot", "parked-batched", "lora-resume-3")
        assert "slot 0 paused at token" in k["waits-bounded"] and "never resumed" in k["waits-bounded"], k
        assert "slot 2: timeout after 0/20 tokens" in k["no-request-fails"], k


@pytest.mark.parametrize("version,family", [(source.DEFAULT_VERSION, "park-slot"), ("0.3.36", "recompute-slot")])
def test_a_request_that_arrives_while_one_is_parked_waits_its_turn(trees, tmp_path, version, family):
    """park-arrivals-3 (issue 36, queues): slot 2 is sent when slot 1 has streamed 210 tokens, just
    after slot 0's park at step 203 and 490 steps before its resume. It must start only once slot 0 is back:
    measured from upstream's log (its queue's "new task" line, the slot's "processing task"). Admitted
    at once (arrivals-first, upstream's admission) nothing fails and every stream is exact: only
    parked-first sees it. C2 with park-slot, D with recompute-slot (the same admission, both built
    for other tests: no TU more)."""
    tree = trees(version)
    res = judge(tree, tmp_path, family, ["park-arrivals-3"])
    if checks(res.results[0])["parked-first"].status == "skip":   # posted after the resume: not reached, run again
        res = judge(tree, tmp_path / "again", family, ["park-arrivals-3"])
    assert res.ok, failures(res)
    run = res.results[0].candidate[0]
    (a,) = measure.admissions(run)
    assert (a.slot, a.parked) == (2, 0) and a.park_step < a.arrived < a.resume_step <= a.started, a
    c = checks(res.results[0])["parked-first"]
    assert c.status == "pass" and c.detail.startswith("1 request(s) arrived while one was parked"), c.detail
    if version == source.DEFAULT_VERSION:
        k = broken(tree, tmp_path / "first", "park-slot", "arrivals-first", "park-arrivals-3")
        assert set(k) == {"parked-first"}, k           # every request completes, every stream exact
        assert re.search(r"task \d+ \(slot 2\) arrived at step \d+ and started at step \d+, while slot 0 was parked "
                         r"\(since step \d+, back at step \d+\)", k["parked-first"]), k
