"""Issue 36, "operators see it": every family counts what it does in /metrics, in upstream's
Prometheus style (llamacpp:kv_full_*), and the counters read after a real workload equal the
events measured: evictions from the clients' errors, parks and resumes from upstream's log. A
variant that gets only the count wrong is killed by metrics-count-events alone."""
import re

import git
import pytest

from toolkit import measure, source, verify, workload
from toolkit.compare import EVICTIONS, PARKS, RESUMES
from toolkit.ui import UI

from .conftest import broken_variant
from .test_preemption import failures, judge


def test_the_eviction_counts_each_victim_and_the_base_counts_nothing(trees, tmp_path):
    res = judge(trees("0.3.35"), tmp_path, "evict-largest-slot", ["overflow-4", "two-overflows"])
    assert res.ok, failures(res)
    for wr in res.results:
        base, cand = wr.base[0], wr.candidate[0]
        # both sides answered /metrics with upstream's own counters; only the candidate has ours
        assert base.metric("llamacpp:n_decode_total") > 0 and cand.metric("llamacpp:n_decode_total") > 0
        assert not [n for n, _ in base.metrics if n.startswith("llamacpp:kv_full")], base.metrics
        victims = sum(o.outcome == "errored" for o in cand.outcomes)
        assert victims == {"overflow-4": 1, "two-overflows": 2}[wr.workload.name] == cand.metric(EVICTIONS)
        checks = {c.name: c for v in wr.verdicts if v.side == "candidate" for c in v.checks}
        assert checks["metrics-count-events"].status == "pass", checks["metrics-count-events"]


@pytest.mark.parametrize("patch_name", ["park-slot", "recompute-slot"])
def test_parks_and_resumes_are_counted_as_measured(trees, tmp_path, patch_name):
    res = judge(trees("0.3.36"), tmp_path, patch_name, ["overflow-4"])
    assert res.ok, failures(res)
    run = res.results[0].candidate[0]
    ps = [p for v in measure.pauses(run).values() for p in v]
    assert ps and run.metric(PARKS) == len(ps) == run.metric(RESUMES), (ps, run.metrics)
    assert run.metric("llamacpp:requests_parked") == 0
    # /slots shows a slot parked only while it is: never one that did not pause
    assert {s.slot for s in run.samples if s.parked} <= set(measure.pauses(run))
    if patch_name == "park-slot":   # swapped: its host bytes were given back
        assert run.metric("llamacpp:kv_full_parked_bytes") == 0
        assert run.metric("llamacpp:kv_full_recomputed_cells_total") is None
    else:                           # recomputed: the cells it held when it came back
        assert run.metric("llamacpp:kv_full_recomputed_cells_total") == sum(p.cells for p in ps) > 0


@pytest.mark.parametrize("patch_name,variant,reason", [
    ("evict-largest-slot", "eviction-not-counted", r"kv_full_evictions_total 0\.0, measured 1 \(requests ended"),
    ("park-slot", "resumes-not-counted", r"kv_full_resumes_total 0\.0, measured [1-9]\d* \(pauses that came back\)"),
    ("park-slot", "parked-bytes-kept", r"kv_full_parked_bytes [1-9][\d.e+]*, measured 0 \(every request ended\)"),
], ids=["eviction-not-counted", "resumes-not-counted", "parked-bytes-kept"])
def test_a_count_that_is_wrong_is_killed_by_the_counter_check_alone(c2, c2_base, tmp_path, patch_name, variant,
                                                                     reason):
    k = broken_variant(c2, tmp_path, patch_name, variant, "overflow-4")
    assert set(k) == {"metrics-count-events"}, k   # every request, stream and log line is right
    assert re.search(reason, k["metrics-count-events"]), k


def test_slots_shows_a_parked_slot_as_parked_and_processing(c2, c2_base, tmp_path):
    """/slots says which slot is parked (`is_parked`, beside upstream's `is_processing`: a parked
    slot is processing, its task alive). never-resumed keeps slot 3 parked until its flooding log
    ends the run, so the /slots poller sees it parked whatever the timing."""
    res = verify.verify(git.Repo(c2.path), base_ref=source.BASELINE_TAG, patch_name="park-slot", variant="never-resumed",
                        workloads=[workload.load("overflow-4")], out_dir=tmp_path, ui=UI(quiet=True))
    run = res.results[0].candidate[0]
    parked = [s for s in run.samples if s.parked]
    assert parked and {s.slot for s in parked} == set(measure.pauses(run)), (parked[:3], measure.pauses(run))
    assert all(s.processing for s in parked)
    assert not any(s.parked for s in res.results[0].base[0].samples)   # upstream has no such state
