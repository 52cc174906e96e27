"""Issue 19: the preemption patches (park by swap, recompute) judged by what preemption promises,
on real binaries: no request fails, each stream equals its control, the pool comes back empty,
no wait while nothing runs, a resumed request comes back where it paused. Every broken variant
(patches/*/patch.toml) is caught, and the test asserts the reason."""
import re
from types import SimpleNamespace

import git
import pytest

from toolkit import apply, coverage, measure, overflows, source, verify, workload
from toolkit.ui import UI

from .conftest import broken_variant, clone, snapshot


def judge(tree, tmp_path, patch_name, names, policy="largest"):
    repo = git.Repo(tree.path)
    return verify.verify(repo, base_ref=source.BASELINE_TAG, patch_name=patch_name, policy=policy,
                         workloads=[workload.load(n) for n in names], out_dir=tmp_path, ui=UI(quiet=True))


def failures(res):
    return [(v.workload, c.name, c.detail) for r in res.results for v in r.verdicts for c in v.checks
            if c.status == "fail"]


@pytest.mark.parametrize("version", ["0.3.35", "0.3.36"], ids=["C2", "D"])
def test_a_parked_request_resumes_byte_identical_to_its_control(trees, tmp_path, version):
    """Swap: the victim pauses (measured in upstream's log), comes back holding the cells it held,
    and its stream equals the no-overflow control token for token, a sampler with state included."""
    res = judge(trees(version), tmp_path, "park-slot", ["overflow-4", "preempt-penalty-4"])
    assert res.expect == "preemption" and res.ok, failures(res)
    for wr in res.results:
        run = wr.candidate[0]
        ps = measure.pauses(run)
        assert ps and all(p.resumed and p.cells == p.cells_before for v in ps.values() for p in v), ps
        words = {o.slot: measure.word(o, ps.get(o.slot, ())) for o in run.outcomes}
        assert sorted(words.values()).count("resumed") == len(ps) and "errored" not in words.values(), words
        checks = {c.name: c for v in wr.verdicts if v.side == "candidate" for c in v.checks}
        assert checks["streams-exact"].status == "pass" and "resumed ones included" in checks["streams-exact"].detail
        assert run.pool_probe == "completed"
        # each park placed in upstream's log and read as an overflow whose victim was parked (issue
        # 34's pairs): the pool full at that step, the parked slot's entry in the batch
        evs = overflows.parks_read_as_overflows(run, wr.workload)
        assert sorted(e.terminated for e in evs) == sorted((s,) for s, v in ps.items() for _ in v), (evs, ps)
        assert all(e.full and e.at(e.terminated[0]) for e in evs), [e.describe() for e in evs]
    reached = [c.shape for c in res.pairs if c.by]
    assert reached and set(reached) <= set(coverage.PAIRS), res.pairs


@pytest.mark.parametrize("version", ["0.3.35", "0.3.36"], ids=["C2", "D"])
def test_recompute_resumes_exactly_on_the_tiny_model(trees, tmp_path, version):
    """Recompute re-prefills the victim's tokens in one batch where they were decoded one by one:
    on CPU with the tiny model the resumed streams still equal the control (batch-invariant here;
    `patchkit referee` reports the same column for any model)."""
    res = judge(trees(version), tmp_path, "recompute-slot", ["overflow-4", "preempt-penalty-4"], policy="smallest")
    assert res.ok, failures(res)
    assert all(measure.parks(wr.candidate[0]) for wr in res.results)


def broken(c2, tmp_path, patch_name, variant, wl):
    return broken_variant(c2, tmp_path, patch_name, variant, wl)


def test_resuming_one_position_back_is_refused_by_the_servers_own_batch_check(c2, c2_base, tmp_path):
    k = broken(c2, tmp_path, "park-slot", "resume-wrong-position", "overflow-4")
    assert re.search(r"slot \d: errored after \d+/240 tokens \(Invalid input batch\.\)", k["no-request-fails"]), k


def test_a_sampler_that_starts_over_on_resume_shows_in_the_stream(c2, c2_base, tmp_path):
    """Greedy sampling has no state to lose: the repetition-penalty workload has (its history)."""
    k = broken(c2, tmp_path, "park-slot", "sampler-reset", "preempt-penalty-4")
    m = re.search(r"slot (\d): differs from its control at token (\d+) \(after its pause at token (\d+)\)",
                  k["streams-exact"])
    assert m and int(m[2]) >= int(m[3]), k
    assert "no-request-fails" not in k and "resumes-where-paused" not in k, k  # only the stream shows it


def test_a_parked_slot_never_resumed_is_named_by_the_wait_bound(c2, c2_base, tmp_path):
    k = broken(c2, tmp_path, "park-slot", "never-resumed", "overflow-4")
    assert re.search(r"slot \d paused at token \d+: never resumed", k["waits-bounded"]), k
    assert "loops without progress" in k["no-request-fails"], k  # stopped by its flooding log, not a 120 s stall


@pytest.mark.parametrize("patch_name", ["park-slot", "recompute-slot"])
def test_a_park_that_keeps_the_cells_frees_nothing(c2, c2_base, tmp_path, patch_name):
    """Nothing is freed, so the retry after the park runs out again: every slot is parked in turn
    and all fail; or, when the last one standing was decoded below the offset, the failed resume's
    clean-up frees the cells a step later and everyone completes, but upstream's log still shows
    the second exhaustion at the same offset after the park."""
    k = broken(c2, tmp_path, patch_name, "cells-kept", "overflow-4")
    assert (re.search(r"errored after \d+/240 tokens \(Context size has been exceeded\.\)", k.get("no-request-fails", ""))
            or re.search(r"parked holding \d+ cells, yet the retry at off \d+ .* did not come back",
                         k.get("parks-free-cells", ""))), k


def test_a_recompute_that_forgets_the_generated_tokens_resumes_elsewhere(c2, c2_base, tmp_path):
    """The tiny model's next tokens barely depend on its context, so its stream matched the control;
    upstream's log shows the resumed entry at the prompt's cell count, not where it paused."""
    k = broken(c2, tmp_path, "recompute-slot", "history-dropped", "overflow-4")
    m = re.search(r"slot (\d): paused holding (\d+) cells, resumed holding (\d+)", k["resumes-where-paused"])
    assert m and int(m[3]) < int(m[2]), k


def test_the_referee_table_measures_every_strategy_on_the_same_requests(c2, c2_base, tmp_path):
    """Through the command a user types, every option of `referee` given."""
    import json
    import subprocess
    import sys

    args = [a for e in ("base", "terminate:largest", "park:largest", "recompute:smallest") for a in ("--strategy", e)]
    res = subprocess.run([sys.executable, "-m", "toolkit", "referee", "--repo", str(c2.path), "--base",
                          source.BASELINE_TAG, *args, "--workload", "overflow-4", "--model", "tiny", "--repeat", "3",
                          "--markdown", str(tmp_path / "comment.md"), "--report-dir", str(tmp_path / "out"), "--json"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    t = json.loads(res.stdout)
    assert t["base_commit"] == c2.commit and t["repeat"] == 3
    assert sorted(r["run"] for r in t["rows"] if r["entry"] == "park:largest") == [1, 2, 3]
    rows = {r["entry"]: SimpleNamespace(**r) for r in t["rows"] if r["run"] == 1}
    assert list(rows) == ["base", "terminate:largest", "park:largest", "recompute:smallest"]
    assert rows["base"].completed == 0 and rows["base"].collateral == 3          # one overflow, four failed
    assert rows["terminate:largest"].completed == 3 and rows["terminate:largest"].collateral == 0
    for name in ("park:largest", "recompute:smallest"):
        r = rows[name]
        assert (r.completed, r.collateral, r.verdict) == (4, 0, "PASS") and r.parks >= 1, r
        assert r.exact == "4/4", r
    assert rows["park:largest"].recomputed == 0 < rows["recompute:smallest"].recomputed
    out = tmp_path / "out"
    assert "<svg" in (out / "report.html").read_text() and "| park:largest |" in (out / "report.md").read_text()
    # three runs per row: medians and ranges, and a ranking that claims only what the rank test shows
    summ = {m["entry"]: m for m in t["summaries"]}
    assert summ["park:largest"]["runs"] == 3 and summ["park:largest"]["verdicts"] == "3/3 PASS"
    med, lo, hi = summ["park:largest"]["makespan"]
    assert lo <= med <= hi
    rank = t["ranking"]["overflow-4"]
    assert rank.startswith(("no measurable difference between", "terminate:largest is measurably fastest",
                            "park:largest is measurably fastest", "recompute:smallest is measurably fastest")), rank
    comment = (tmp_path / "comment.md").read_text()
    assert "patchkit referee --repo" in comment and "--repeat 3" in comment and f"Ranking: {rank}" in comment
    print(comment)


def test_park_applies_checks_and_reverts_like_the_eviction(c2, tmp_path):
    """Same apply, idempotence, presence checks and revert as the eviction patch; recognised by its
    own definitions (no markers in the code)."""
    from toolkit import check, patch

    repo = clone(c2, tmp_path / "repo")
    before = snapshot(repo)
    res = apply.apply(repo, patch_name="park-slot", policy="not-leader-smallest")
    assert res.status == "applied" and res.layout == "C2" and repo.active_branch.name == \
        "patchkit/park-slot-not-leader-smallest"
    text = (tmp_path / "repo" / res.file).read_text()
    assert patch.state(text, patch.load_patch("park-slot")) == "applied" and "patchkit" not in text.lower()
    assert apply.apply(repo, patch_name="park-slot", policy="not-leader-smallest").status == "already-applied"
    ck = check.check(repo, patch_name="park-slot", compile=False)
    assert ck.static and all(c.status == "pass" for c in ck.static), ck.static
    apply.revert(repo)
    assert snapshot(repo) == before


def test_a_layout_the_preemption_patches_are_not_written_for_is_refused_untouched(trees, tmp_path):
    from toolkit.errors import LayoutError

    repo = clone(trees("0.3.32"), tmp_path / "repo")  # layout C: a pre_decode() step, not C2's prompt API
    before = snapshot(repo)
    with pytest.raises(LayoutError, match="written for layouts C2 and D"):
        apply.apply(repo, patch_name="recompute-slot")
    assert snapshot(repo) == before
