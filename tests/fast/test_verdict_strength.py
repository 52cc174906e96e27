"""Verdict strength on recorded runs (tests/fast/sim.py): the separating workloads' shapes, the
policies' rules for ties, earlier starts judged, and the mutant catalog's structure."""
from dataclasses import replace
from pathlib import Path

import pytest

from toolkit import compare, measure, patch, verify
from toolkit.errors import PatchError, UsageError
from toolkit.record import Outcome, Run, Trace
from toolkit.workload import load

from .sim import EXC, simulate
from .test_patch_render import LAYOUTS, SPEC, SRC, facts

WD = load("victim-decoded")
WC = load("cells-not-prompt")
WL = load("overflow-4")
WP = load("prompt-victim")


def run(wl, **kw):
    return simulate([len(r.prompt) for r in wl.requests], [r.n_predict for r in wl.requests], wl.server.ctx, **kw)


def control(wl):
    return simulate([len(r.prompt) for r in wl.requests], [r.n_predict for r in wl.requests], 8192)


def failed(v):
    return {c.name: c.detail for c in v.checks if c.status == "fail"}


def test_victim_decoded_fails_at_off_3_by_arithmetic():
    r = run(WD)
    ev, = measure.overflows(r, WD)
    assert (ev.off, ev.expected, ev.at(0).position) == (3, (0,), 0)
    assert measure.decoded_first(ev)[0] and measure.shape(r, WD) is None
    v = verify.judge(WD, "candidate", r, control=control(WD))
    assert v.ok, failed(v)
    # victim-first's prompts (sum 280) fail at off 0: that shape is not this workload's, made again
    r0 = simulate([100, 80, 60, 40], 240, 1024)
    assert "not decoded yet" in measure.shape(r0, WD)


LATE = [0, 0, 60, 60]   # the late pair 60 steps behind (the sizing needs > 30)


def test_cells_not_prompt_separates_prompt_length_from_cells():
    r = run(WC, launch=LATE)
    ev, = measure.overflows(r, WC)
    assert ev.expected == (0,)
    ok, why = measure.prompt_not_largest(ev)
    assert ok, why
    assert verify.judge(WC, "candidate", r, control=control(WC)).ok
    # a patch choosing by prompt length terminates slot 3 (prompt 70): caught, for that reason
    prompts = [40, 30, 60, 70]
    bad = run(WC, launch=LATE, key=lambda j: prompts[j])
    f = failed(verify.judge(WC, "candidate", bad, control=control(WC)))
    assert "terminated [3], measured largest: [0]" in f["victim-is-largest"]


def test_cells_not_prompt_without_the_lead_is_made_again():
    r = run(WC, launch=[0, 0, 10, 10])          # 10 steps behind: the longest prompt holds the most
    assert "the same slot" in measure.shape(r, WC)


def test_newest_is_the_task_the_server_created_last_even_when_released_together():
    r = run(WL, policy="newest")
    ev, = measure.overflows(r, WL, "newest")
    assert ev.expected == (3,) and ev.margin > ev.uncertainty
    v = verify.judge(WL, "candidate", r, control=control(WL), policy="newest")
    assert v.ok, failed(v)
    wrong = verify.judge(WL, "candidate", run(WL), control=control(WL), policy="newest")  # largest = 3 too
    assert wrong.ok   # overflow-4's largest is also its newest: the policies agree there
    f = failed(verify.judge(load("victim-first"), "candidate", run(load("victim-first")),
                             control=control(load("victim-first")), policy="newest"))
    assert "terminated [0], measured newest: [3]" in f["victim-is-newest"]


def test_shapes_designed_for_largest_are_not_demanded_of_other_policies():
    wf = load("victim-first")
    r = run(wf, policy="smallest")
    assert measure.shape(r, wf, "smallest") is None
    v = verify.judge(wf, "candidate", r, control=control(wf), policy="smallest")
    assert v.ok, failed(v)
    assert any(c.name == "designed-shape" and c.status == "skip" for c in v.checks)


def test_an_earlier_start_is_judged_not_dropped():
    good = run(WL)
    lying = run(WL, lie=True)
    v = verify.judge(WL, "candidate", replace(good, earlier=(replace(lying, attempts=1, log="start1.log"),)),
                      control=control(WL))
    f = failed(v)
    assert "earlier-starts" in f and "start 1 (start1.log): victim-is-largest" in f["earlier-starts"]
    ok = verify.judge(WL, "candidate", replace(good, earlier=(replace(good, attempts=1),)), control=control(WL))
    assert ok.ok and any(c.name == "earlier-starts" and c.status == "pass" for c in ok.checks)


def test_an_earlier_start_without_overflow_must_complete_everything():
    complete = control(WL)
    v = verify.judge(WL, "candidate", replace(run(WL), earlier=(replace(complete, attempts=1),)), control=control(WL))
    assert v.ok


@pytest.mark.parametrize("family", ["evict-largest-slot", "park-slot", "recompute-slot"])
@pytest.mark.parametrize("layout", ["C2", "D"])
def test_every_mutant_edits_the_rendered_right_patch(layout, family):
    spec = patch.load_patch(family)
    f = replace(facts(**LAYOUTS[layout]), enum_at=0, enum_indent="    ", resume_at=0, resume_indent="    ",
                slot_json_at=0, slot_json_indent="    ", skip_at=0, skip_indent="    ", admit_at=0, admit_indent="    ")
    right = patch.render(SRC, f, spec, stage=1)
    same = [name for name in spec.variants if patch.render(SRC, f, spec, stage=1, variant=name) == right]
    assert same == [] and len(spec.variants) >= (12 if family == "evict-largest-slot" else 3)


def test_every_mutant_names_its_class_and_killer():
    for name, m in SPEC.variants.items():
        assert m.get("class") in ("victim choice", "batch surgery", "termination", "guards and modes"), name
        assert m.get("killer") and m.get("what"), name


def _family_copy(tmp_path, extra: str):
    (tmp_path / "x").mkdir()
    for f in SPEC.root.iterdir():
        (tmp_path / "x" / f.name).write_bytes(f.read_bytes())
    meta = tmp_path / "x" / "patch.toml"
    meta.write_text(meta.read_text() + extra)
    return tmp_path


def test_a_mutant_with_an_unknown_key_or_a_bad_edit_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(patch.FAMILIES_ENV, str(_family_copy(tmp_path, '\n[variants.typo]\nremap_indexes = false\n')))
    with pytest.raises(UsageError, match=r"variant 'typo' must be .*unknown keys \['remap_indexes'\]"):
        patch.load_patch("x")


def test_a_mutant_whose_edit_no_longer_matches_is_an_error_not_the_right_patch(tmp_path, monkeypatch):
    """A right patch that changed under a mutant must not render the right patch under the mutant's name."""
    monkeypatch.setenv(patch.FAMILIES_ENV, str(_family_copy(
        tmp_path, "\n[variants.stale]\nwhat = 'w'\nedit = [{ find = 'no_such_line\\(\\);', to = 'x' }]\n")))
    spec = patch.load_patch("x")
    with pytest.raises(PatchError, match=r"variant 'stale' of 'evict-largest-slot': edit 1 finds nothing .* layout C2"):
        patch.render(SRC, facts(), spec, stage=1, variant="stale")


def test_a_mutant_applies_only_where_its_condition_holds():
    """spec-not-remapped needs speculative indices; on a layout without them it renders the right
    patch (the campaign calls that not-applicable), and only there."""
    no_spec = facts(**LAYOUTS["A"])
    assert patch.render(SRC, no_spec, SPEC, stage=1, variant="spec-not-remapped") == patch.render(SRC, no_spec, SPEC, stage=1)
    c2 = facts()
    assert patch.render(SRC, c2, SPEC, stage=1, variant="spec-not-remapped") != patch.render(SRC, c2, SPEC, stage=1)


def test_the_templates_hold_the_right_patch_only():
    """The catalog's variants are edits in patch.toml: no template a maintainer reads branches for a mutant."""
    for family in patch.families():
        for t in patch.load_patch(family).root.glob("*.j2"):
            assert "MUTANT" not in t.read_text() and "BROKEN" not in t.read_text(), t


def test_campaign_score_and_runs_killed():
    from toolkit.mutate import Kill, MutantResult, score, table

    def m(name, status, kills=(), killer="victim-is-largest", repeat=3):
        return MutantResult(name, "victim choice", "", killer, "C2", status, tuple(kills), 1.0, "", repeat)
    res = (
        m("a", "killed", [Kill("victim-is-largest", "overflow-4 run 1", "x", 1),
                          Kill("victim-is-largest", "overflow-4 run 3", "x", 3)]),
        m("b", "killed", [Kill("property", "property", "FAIL", 0)]),
        m("c", "ALIVE"),
        m("d", "ALIVE", killer="equivalent"),
        m("e", "not-applicable"),
    )
    assert [r.runs_killed for r in res[:3]] == [2, 3, 0]
    assert score(res) == (2, 3)   # the equivalent claim and the inapplicable one are not judged
    t = table(res)
    assert "mutation score: 2/3 killed (67 %)" in t
    assert "equivalent (claimed)" in t and "2/3" in t


def prompt_phase_run():
    """A recorded step of prompt-victim's shape: slots 0-2 generating (entries logged with 100,
    110, 120 cells), slot 3 launched with no entry (in its prompt: upstream logs no line per
    chunk), 64 entries, the step failing at off 10 of a 1024-cell pool, slot 3 terminated."""
    tr = [Trace("launch", j, 50 + j) for j in range(4)] + [Trace("step")]
    tr += [Trace("entry", j, 50 + j, 100 + 10 * j, 7) for j in range(3)]
    tr += [Trace("batch", value=64), Trace("retry", value=10, token=1), Trace("error", task=53, text=EXC)]
    outs = tuple(Outcome(j, "errored" if j == 3 else "completed", 200, EXC if j == 3 else None, j != 3, None, None,
                         None, (), len(WP.requests[j].prompt), WP.requests[j].n_predict, 0.0, None, 1.0)
                 for j in range(4))
    return Run("prompt-victim", outs, (), (), True, None, 1.0, "log", pool=1024, trace=tuple(tr))


def test_a_victim_in_its_prompt_is_measured_by_the_pools_accounting():
    """The step fails when not one cell is free, so every cell is a slot's: the prompt slot held
    1024 - 10 (off) - 330 (the generating slots') = 684 when the step began, plus its 7 entries
    decoded below off (the 3 generating entries come first): 691, the largest, nothing leaked."""
    ev, = measure.overflows(prompt_phase_run(), WP)
    cells = {s.slot: s.cells for s in ev.in_play}
    assert cells == {0: 101, 1: 111, 2: 121, 3: 691}
    assert ev.leaked == 0 and ev.full and ev.expected == (3,) and ev.terminated == (3,)
    assert next(s for s in ev.in_play if s.slot == 3).source == "server log (pool accounting)"


def judged(v, *more):
    """The statuses of the checks that read the overflow's cells (a recorded step, not a whole run:
    the streams' own checks have nothing to read)."""
    names = ("one-victim-per-overflow", "victim-is-largest") + more
    return {c.name: c.status for c in v.checks if c.name in names}


def two_prompts(prompt4=40, prompt3=None):
    """prompt_phase_run with a fifth slot launched and in its prompt too: slots 3 and 4 hold the
    691 cells the generating slots do not (684 + 7 decoded below off) between them."""
    r = prompt_phase_run()
    tr = list(r.trace)
    tr.insert(4, Trace("launch", 4, 54))
    outs = r.outcomes + (replace(r.outcomes[0], slot=4, prompt_tokens=prompt4),)
    if prompt3 is not None:
        outs = tuple(replace(o, prompt_tokens=prompt3) if o.slot == 3 else o for o in outs)
    wl = replace(WP, requests=WP.requests + (replace(WP.requests[0], slot=4),), server=replace(WP.server, parallel=5))
    return replace(r, outcomes=outs, trace=tuple(tr)), wl


def test_two_slots_in_their_prompt_are_measured_together():
    """The accounting gives their sum (691); each holds at most its prompt, at least what the
    other's prompt leaves: slot 3 (prompt 960) in [651, 691], slot 4 (prompt 40) in [0, 40]. So
    slot 3 held the most, measured, and nothing leaked. (Before, slot 4 was left out and its
    cells and slot 3's read as 684 leaked: a right eviction FAILED.)"""
    r, wl = two_prompts()
    ev, = measure.overflows(r, wl)
    cells = {s.slot: (s.cells, s.spread) for s in ev.in_play}
    assert cells == {0: (101, 0), 1: (111, 0), 2: (121, 0), 3: (671, 20), 4: (20, 20)}
    assert ev.leaked == 0 and ev.full and ev.expected == (3,) and ev.margin == 550
    assert judged(verify.judge(wl, "candidate", r)) == {"one-victim-per-overflow": "pass", "victim-is-largest": "pass"}


def test_cells_beyond_the_prompts_room_are_leaked():
    """Mutant of the accounting: slot 3's prompt 600, so the two prompts hold at most 640 of the
    691 cells: 51 are no slot's (a terminated slot's cells not freed reads so), and
    one-victim-per-overflow fails quoting them."""
    r, wl = two_prompts(prompt3=600)
    ev, = measure.overflows(r, wl)
    assert ev.leaked == 51 and not ev.full
    assert "51 cell(s) taken by no slot in play" in failed(verify.judge(wl, "candidate", r))["one-victim-per-overflow"]


def test_prompts_not_told_apart_tie_within_the_measurements_doubt():
    """Two prompts of 960: each holds anywhere in [0, 691], so which held the most is not measured.
    By the policy's equivalence (issue 34: any slot within the measured uncertainty of the largest
    is a right victim) either is right, and the detail says the tie is the measurement's doubt."""
    r, wl = two_prompts(prompt4=960)
    ev, = measure.overflows(r, wl)
    # one of the two holds at least half of the 691 (346): the generating slots (101-121) cannot be
    # the largest, though each range alone reaches down to them
    assert ev.expected == (3, 4) and ev.full
    v = verify.judge(wl, "candidate", r)
    c = next(c for c in v.checks if c.name == "victim-is-largest")
    assert c.status == "pass" and "tied within the measurement's doubt of 346 cells" in c.detail, c
    assert judged(v) == {"one-victim-per-overflow": "pass", "victim-is-largest": "pass"}
    # mutant: the error sent to generating slot 2 instead (121 cells): outside the band, a FAIL
    wrong = replace(r, trace=tuple(replace(t, task=52) if t.kind == "error" else t for t in r.trace),
                    outcomes=tuple(replace(o, outcome="errored" if o.slot == 2 else "completed",
                                           error=EXC if o.slot == 2 else None) for o in r.outcomes))
    assert "terminated [2], measured largest: [3, 4]" in failed(verify.judge(wl, "candidate", wrong))["victim-is-largest"]


FLAKE_LOG = Path(__file__).parent / "logs" / "prompt-survivor-full.two-prompts.log"


def flake_run(text=None, victim=0):
    """A real CI run (2026-12-07, layout D, the right patch): prompt-survivor-full's earlier start
    with both slots in their prompts when the pool ran out (slot 0: 576 of 600 cells, slot 1: 448
    of 500), slot 0 terminated. Upstream's log, cut after the eviction; the outcomes as measured."""
    from toolkit.record import events_from_log, trace_from_log
    text = text or FLAKE_LOG.read_text()
    wl = load("prompt-survivor-full")
    outs = tuple(Outcome(s, "errored" if s == victim else "completed", 200, EXC if s == victim else None, True,
                         None, None, None, (), p, r.n_predict, 0.0, None, 0.19)
                 for s, p, r in ((0, 600, wl.requests[0]), (1, 500, wl.requests[1])))
    return Run(wl.name, outs, (), events_from_log(text), True, None, 1.0, text, pool=1024,
               trace=trace_from_log(text)), wl


def test_a_right_eviction_of_two_prompts_passes_on_the_real_log():
    """The CI flake: its step had prompt chunks alone (no entry line), and it was read as the step
    before it. Each slot's chunk line names the cells it held as its chunk joined the batch: slot 0
    576, slot 1 448 (1024: the pool, full), nothing decoded at off 0; slot 0 held the most."""
    r, wl = flake_run()
    ev, = measure.overflows(r, wl)
    assert {s.slot: (s.cells, s.spread, s.phase, s.position) for s in ev.in_play} == \
        {0: (576, 0, "prompt", 0), 1: (448, 0, "prompt", 24)}
    assert (ev.expected, ev.margin, ev.uncertainty, ev.leaked, ev.full) == ((0,), 128, 0, 0, True)
    assert judged(verify.judge(wl, "candidate", r), "witness-agrees") == dict.fromkeys(
        ("one-victim-per-overflow", "victim-is-largest", "witness-agrees"), "pass")


def test_without_chunk_lines_two_prompts_are_measured_together_on_the_real_log():
    """The same log without the chunk lines (a layout or a batch that names none): the accounting
    gives their sum (1024), each in a range from the prompts' room: slot 0 in [524, 600], slot 1 in
    [424, 500]. Slot 0 still held the most, measured, and the witness's 576 is within its range."""
    text = "\n".join(x for x in FLAKE_LOG.read_text().splitlines() if "memory_seq_rm" not in x)
    r, wl = flake_run(text)
    ev, = measure.overflows(r, wl)
    assert {s.slot: (s.cells, s.spread) for s in ev.in_play} == {0: (562, 38), 1: (462, 38)}
    assert (ev.expected, ev.margin, ev.uncertainty, ev.leaked, ev.full) == ((0,), 100, 76, 0, True)
    assert judged(verify.judge(wl, "candidate", r), "witness-agrees") == dict.fromkeys(
        ("one-victim-per-overflow", "victim-is-largest", "witness-agrees"), "pass")


def test_the_real_log_still_catches_a_wrong_victim_a_wrong_witness_and_a_leak():
    """Mutants on the same log: the error sent to slot 1 (448 cells) fails victim-is-largest; the
    patch's line claiming 700 cells fails witness-agrees; slot 1's chunk line at 400 cells leaves
    48 cells no slot holds, and one-victim-per-overflow fails quoting them."""
    text = FLAKE_LOG.read_text()
    r, wl = flake_run(text.replace("send_error: task id = 8,", "send_error: task id = 0,"), victim=1)
    assert "OUTSIDE the policy's choice" in failed(verify.judge(wl, "candidate", r))["victim-is-largest"]
    r, wl = flake_run(text.replace("terminating slot 0 (576 cells", "terminating slot 0 (700 cells"))
    assert failed(verify.judge(wl, "candidate", r))["witness-agrees"] == "log says slot 0 held 700 cells, measured 576"
    leak = "id  1 | task 0 | cached n_tokens = 448, memory_seq_rm [448, end)"
    assert leak in text
    r, wl = flake_run(text.replace(leak, leak.replace("[448", "[400")))
    assert "48 cell(s) taken by no slot in play" in failed(verify.judge(wl, "candidate", r))["one-victim-per-overflow"]


def test_the_counters_are_held_to_the_events_measured():
    """metrics-count-events: a series that promises counters is judged by /metrics after the run
    against what was measured; a count that is off, or missing, fails with both numbers; a
    candidate that promises none is not judged by them."""
    r = run(WL)
    counted = compare.Promises(witness=False, counters=True)

    def check(metrics, own=counted):
        v = verify.judge(WL, "candidate", replace(r, metrics=metrics), control=control(WL), own=own)
        return next((c for c in v.checks if c.name == "metrics-count-events"), None)

    victims = sum(o.outcome == "errored" for o in r.outcomes)
    assert victims == 1
    assert check(((compare.EVICTIONS, 1.0),)).status == "pass"
    assert "kv_full_evictions_total 0.0, measured 1 (requests ended" in check(((compare.EVICTIONS, 0.0),)).detail
    assert check(((compare.EVICTIONS, 2.0),)).status == "fail"
    assert "missing from /metrics (promised" in check((("llamacpp:n_decode_total", 9.0),)).detail
    assert check(None).status == "skip"             # not read: the server did not answer
    assert check(((compare.EVICTIONS, 0.0),), own=compare.NONE) is None   # a foreign patch promises none


def test_a_mutant_whose_killer_never_judged_it_is_not_reached_not_alive():
    """A variant's killer that skipped in every run (its shape not reached: park-arrivals-3's arrival
    posted after the resume by a descheduled client) is no evidence either way: not-reached, with
    the skip's reason. A failing check anywhere, or one run that reached it, decides as before."""
    from types import SimpleNamespace as NS

    from toolkit.compare import Check, Verdict
    from toolkit.mutate import suite_kills

    skip = Check("parked-first", "skip", "no request arrived while one was parked (a shape not reached)")
    ok = Check("parked-first", "pass", "1 request(s) arrived while one was parked")
    bad = Check("parked-first", "fail", "task 7 (slot 2) arrived at step 320 and started at step 320")

    def wr(*checks, side="candidate"):
        return NS(workload=NS(name="park-arrivals-3"),
                  verdicts=[Verdict("park-arrivals-3", side, i, (c,)) for i, c in enumerate(checks)])
    kills, why = suite_kills([wr(skip, skip), wr(bad, side="base")], "parked-first")
    assert kills == [] and why.count("parked-first skipped on park-arrivals-3 run") == 2 and "not reached" in why
    assert suite_kills([wr(skip, ok)], "parked-first") == ([], "")          # reached once: ALIVE if nothing failed
    kills, why = suite_kills([wr(skip, bad)], "parked-first")
    assert [(k.check, k.where, k.run) for k in kills] == [("parked-first", "park-arrivals-3 run 2", 2)] and why == ""
    assert suite_kills([wr(skip)], "streams-exact") == ([], "")              # another killer: not this rule's


def test_the_band_of_right_victims_is_every_slot_that_can_hold_the_most():
    """The policy's equivalence within the measurement's doubt: a slot is a right victim when its
    range reaches what the choice surely holds. Slot 0 measured 100±50 (from arrival times), slot 1
    exactly 90, slot 2 exactly 60: the largest holds at least 90, so slot 2 (60 at most) is outside
    the band (it was inside when the band was "within the summed spreads of the best", 40 <= 50)."""
    from toolkit.overflows import SlotAt, _choose

    def at(slot, cells, spread):
        return SlotAt(slot, 40, 1, cells, slot, spread, "arrival times")
    slots = [at(0, 100, 50), at(1, 90, 0), at(2, 60, 0)]
    assert _choose(slots, "largest", WL)[0] == (0, 1)
    assert _choose(slots, "smallest", WL)[0] == (2, 0)      # the smallest holds at most 60: slot 0 reaches 50
    assert _choose([at(0, 100, 0), at(1, 90, 0), at(2, 100, 0)], "largest", WL)[:2] == ((0, 2), 10)


def test_a_chunk_line_is_read_in_every_layouts_wording():
    """The cells a slot in its prompt holds as its next chunk joins the batch: "cached n_tokens = N,
    memory_seq_rm [p0, end)" from B on (SLT_TRC), "kv cache rm [p0, end)" on A (SLT_INF). p0 is what
    it holds (the rest is removed), not N (the cached prompt, which may be longer)."""
    from toolkit.record import trace_from_log
    b_on = "0.00.188.195 I slot   operator(): id  1 | task 0 | cached n_tokens = 450, memory_seq_rm [448, end)"
    a = "slot update_slots: id  3 | task 12 | kv cache rm [640, end)"
    assert trace_from_log(b_on + "\n" + a) == (Trace("chunk", 1, 0, 448), Trace("chunk", 3, 12, 640))
