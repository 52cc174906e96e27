"""Shape coverage (issue 26), pure: each measured overflow is read into the cells it reached."""
from dataclasses import replace

import pytest

from toolkit import coverage, patch, workload
from toolkit.measure import Overflow, SlotAt


def ov(slots, terminated, off, entries, expected=None):
    return Overflow(0.0, tuple(terminated), tuple(slots), 1024, off, entries, tuple(expected or terminated), 10, 0)


def gen(slot, position, cells=100):
    return SlotAt(slot, 40, cells - 40, cells, position, 0, "server log")


def prompt(slot, position, cells=500):
    return SlotAt(slot, 900, 0, cells, position, 0, "server log (pool accounting)", "prompt")


def test_victim_first_of_four_generating_at_off_0():
    got = coverage.overflow_shapes(ov([gen(0, 0, 300), gen(1, 1), gen(2, 2), gen(3, 3)], [0], 0, 4))
    assert got == {"in play: 3+", "victim: generating", "survivor: generating", "victim undecoded: 1",
                   "survivor undecoded: 1", "victim entries: before every survivor's"}


def test_victim_decoded_before_the_pool_ran_out_and_between_survivors():
    got = coverage.overflow_shapes(ov([gen(0, 0), gen(1, 1, 300), gen(2, 2)], [1], 2, 3))
    assert {"victim undecoded: 0", "survivor undecoded: 0", "survivor undecoded: 1",
            "victim entries: between survivors'"} <= got


def test_victim_in_its_prompt_with_a_chunk_undecoded_and_two_in_play():
    # 2 generating entries, then the prompt chunk (62 entries) from position 2; failure at off 5
    got = coverage.overflow_shapes(ov([gen(0, 0), prompt(3, 2)], [3], 5, 64))
    assert {"in play: 2", "victim: in its prompt", "victim undecoded: >1", "survivor undecoded: 0",
            "victim entries: after every survivor's"} <= got


def test_a_survivor_in_its_prompt():
    got = coverage.overflow_shapes(ov([gen(0, 0, 600), gen(1, 1), prompt(2, 2, 300)], [0], 0, 40))
    assert {"survivor: in its prompt", "survivor undecoded: >1", "victim: generating"} <= got


def test_matrix_names_the_first_run_and_what_no_run_reached():
    wl = workload.load("overflow-4")
    assert coverage.sampler(wl) == "sampler: greedy"
    declared = patch.load_patch().shapes
    assert set(declared) == set(coverage.EVICTION)
    cov = coverage.matrix([], declared, "eviction")
    assert coverage.missed(cov) == list(declared)


def test_every_family_declares_known_shapes():
    for fam in patch.families():
        spec = patch.load_patch(fam)
        assert spec.shapes and set(spec.shapes) <= set(coverage.SHAPES), fam
    # park and recompute park generating slots only: a prompt-phase park is not theirs to reach
    assert "parked: in its prompt" not in patch.load_patch("park-slot").shapes


def test_the_default_suite_holds_the_family_workloads_export_shows():
    from toolkit import export, verify
    assert set(export.FAMILIES) <= set(verify.SUITE)
    for name in ("two-slots", "prompt-victim", "prompt-survivor", "stateful-4"):
        assert name in verify.SUITE


def test_a_shape_reached_in_some_repeats_only_is_named():
    """--repeat 3: each cell says in how many repeats it was reached; the summary names a cell one
    repeat missed instead of counting it reached."""
    from toolkit import coverage as cov
    from toolkit.report import summary_line
    from toolkit.verify import Result
    cells = (cov.Reached("in play: 2", "two-slots run 1", 3, 3), cov.Reached("sampler: stateful", "stateful-4 run 2", 1, 3))
    assert cells[0].where() == "two-slots run 1 (in 3 of 3 repeats)"
    res = Result("r", "b", "c", "l", None, "largest", "C2", (), (), "", "eviction", "", coverage=cells)
    assert summary_line(res).endswith("shapes reached 2/2; sampler: stateful in 1 of 3 repeats only")
    res = Result("r", "b", "c", "l", None, "largest", "C2", (), (), "", "eviction", "", coverage=cells[:1])
    assert summary_line(res).endswith("shapes reached 1/1 in each of 3 repeats")


def test_pairs_of_the_victims_undecoded_entries_and_a_survivors_place():
    """Issue 34: the index arithmetic depends on the combination, so it is counted as one."""
    # victim slot 1 decoded (position 1 < off 2): slot 0 before it decoded, slot 2 after it not
    got = coverage.overflow_pairs(ov([gen(0, 0), gen(1, 1, 300), gen(2, 2)], [1], 2, 3))
    assert got == {"victim undecoded 0 x survivor before, undecoded 0", "victim undecoded 0 x survivor after, undecoded 1"}
    # a victim in its prompt with its chunk undecoded: every generating survivor is before it
    got = coverage.overflow_pairs(ov([gen(0, 0), gen(1, 1), prompt(3, 2)], [3], 1, 64))
    assert got == {"victim undecoded >1 x survivor before, undecoded 0", "victim undecoded >1 x survivor before, undecoded 1"}
    # a survivor in its prompt after a generating victim not decoded
    got = coverage.overflow_pairs(ov([gen(0, 0, 600), gen(1, 1), prompt(2, 2, 300)], [0], 0, 40))
    assert got == {"victim undecoded 1 x survivor after, undecoded 1", "victim undecoded 1 x survivor after, undecoded >1"}
    assert got <= set(coverage.PAIRS)


def test_the_reachable_pairs_follow_from_the_batch_layout():
    """Enumerate every batch the server can build (generating entries first, then one prompt
    chunk; any victim, any failure offset): the pairs reached are exactly coverage.PAIRS."""
    reached = set()
    for n_gen in range(0, 4):
        for with_prompt in (False, True):
            slots = [gen(k, k) for k in range(n_gen)] + ([prompt(n_gen, n_gen)] if with_prompt else [])
            entries = n_gen + (5 if with_prompt else 0)
            for victim in slots:
                for off in range(entries):
                    reached |= coverage.overflow_pairs(ov(slots, [victim.slot], off, entries))
    assert reached == set(coverage.PAIRS), sorted(set(coverage.PAIRS) ^ reached)
    assert len(coverage.PAIRS) == 10 and set(coverage.PAIRS) < set(coverage.PAIRS_ALL)


def test_a_pair_argued_unreachable_but_measured_is_listed(monkeypatch):
    """If the argument is wrong, the table shows the pair it said could not happen."""
    from toolkit import measure
    cov = coverage.pair_matrix([])
    assert [c.shape for c in cov] == list(coverage.PAIRS) and all(c.by is None for c in cov)
    # two prompts told apart would put a survivor after a victim with undecoded entries, decoded
    impossible = ov([prompt(0, 0), gen(1, 9)], [0], 10, 12)
    monkeypatch.setattr(measure, "overflows", lambda run, wl, policy="largest": [impossible])
    cov = {c.shape: c for c in coverage.pair_matrix([("w run 1", None, None)])}
    assert cov["victim undecoded >1 x survivor after, undecoded 0"].by == "w run 1"
    assert "victim undecoded >1 x survivor after, undecoded 0" not in coverage.PAIRS


def test_a_default_suite_run_that_missed_a_pair_is_inconclusive_under_the_largest_policy():
    """Each reachable pair is some suite workload's by design (its expect.pairs): a run of the
    whole suite that missed one says so and is INCONCLUSIVE, never a FAIL; under another policy
    (the workloads are sized for largest) the pairs are listed, not judged."""
    from toolkit import report, verify
    wrs = tuple(verify.WorkloadResult(workload.load(n), (), (), None, ()) for n in verify.SUITE)
    shapes = tuple(coverage.Reached(s, "overflow-4 run 1", 1, 1) for s in coverage.EVICTION)
    every = tuple(coverage.Reached(p, "overflow-4 run 1", 1, 1) for p in coverage.PAIRS)
    res = verify.Result("repo", "b" * 40, "c" * 40, "candidate", None, "largest", None, wrs, (), "",
                        coverage=shapes, pairs=every)
    assert res.outcome == "PASS" and "pairs reached 10/10" in report.summary_line(res)
    missed = every[:-1] + (coverage.Reached(coverage.PAIRS[-1], None, 0, 1),)
    res = verify.Result("repo", "b" * 40, "c" * 40, "candidate", None, "largest", None, wrs, (), "",
                        coverage=shapes, pairs=missed)
    assert res.ok and res.outcome == "INCONCLUSIVE"
    assert f"pairs reached 9/10, not reached: {coverage.PAIRS[-1]}" in report.summary_line(res)
    res = verify.Result("repo", "b" * 40, "c" * 40, "candidate", None, "smallest", None, wrs, (), "",
                        coverage=shapes, pairs=missed)
    assert res.outcome == "PASS"
    # a missed shape makes the suite INCONCLUSIVE too
    res = verify.Result("repo", "b" * 40, "c" * 40, "candidate", None, "largest", None, wrs, (), "",
                        coverage=shapes[:-1] + (coverage.Reached(shapes[-1].shape, None, 0, 1),), pairs=every)
    assert res.outcome == "INCONCLUSIVE"
    assert f"shapes reached {len(shapes) - 1}/{len(shapes)}, not reached: {shapes[-1].shape};" in \
        report.summary_line(res)
    # many missed (one workload run alone): counted, the tables name each; three or fewer are named
    few = tuple(coverage.Reached(c.shape, None, 0, 1) if k < 4 else c for k, c in enumerate(shapes))
    res = verify.Result("repo", "b" * 40, "c" * 40, "candidate", None, "largest", None, wrs, (), "",
                        coverage=few, pairs=every[:7] + tuple(coverage.Reached(p, None, 0, 1) for p in coverage.PAIRS[7:]))
    line = report.summary_line(res)
    assert f"shapes reached {len(shapes) - 4}/{len(shapes)}, not reached: 4, each marked NOT REACHED in the shapes " \
        "table;" in line and shapes[0].shape not in line, line
    assert line.endswith(f"pairs reached 7/10, not reached: {', '.join(coverage.PAIRS[7:])}"), line
    # --fail-fast stopped on a failure the final expectations did not confirm: the workloads it did
    # not run judged nothing, so no PASS (a failed check stays FAIL: verify's real tests)
    stopped = verify.Result("repo", "b" * 40, "c" * 40, "candidate", None, "largest", None, wrs[:1], (), "",
                            coverage=shapes, pairs=every, not_run=("overflow-4",))
    assert stopped.ok and stopped.outcome == "INCONCLUSIVE"
    assert "; --fail-fast stopped at the first failed workload: 1 not run (overflow-4)" in report.summary_line(stopped)
    assert replace(stopped, not_run=()).outcome == "PASS"


def test_every_reachable_pair_is_a_suite_workloads_by_design():
    from toolkit import verify
    designed = {p: n for n in verify.SUITE for p in workload.load(n).expect.pairs}
    assert set(designed) == set(coverage.PAIRS), sorted(set(coverage.PAIRS) - set(designed))


def test_a_designed_pair_missed_is_a_shape_not_reached():
    """prompt-victim at off 24 (a request a step late, measured in a loaded CI run): the survivors'
    entries were decoded, its designed pair missed; the start is made again, and a judged run
    that still misses it is no evidence against the patch."""
    from toolkit import compare, overflows
    wl = workload.load("prompt-victim")
    late = ov([gen(0, 0), gen(1, 1), gen(2, 2), prompt(3, 3)], [3], 24, 64)
    (name, ok, why), = overflows.designed(late, wl)
    assert name == "designed-pairs" and not ok and "missed victim undecoded >1 x survivor before, undecoded 1" in why
    assert "at off 24, 64 entries" in why and name in compare.SHAPE_CHECKS
    full = ov([gen(0, 0), gen(1, 1), gen(2, 2), prompt(3, 3)], [3], 0, 64)
    assert overflows.designed(full, wl)[0][1]


def test_a_pair_no_batch_can_hold_is_refused_in_a_workload(tmp_path):
    import tomllib
    data = tomllib.loads(open(workload.load("overflow-4").path).read())
    data["expect"]["pairs"] = ["victim undecoded >1 x survivor after, undecoded 0"]
    with pytest.raises(ValueError, match="not pairs the batch can hold"):
        workload.parse(data)
