"""Issue 3/4: patched builds on real binaries, the suite, and oracles that are proven able to fail."""
import git
import pytest

from toolkit import runner, verify, workload
from toolkit.compare import EXCEEDED
from toolkit.ui import UI


def run(tree, tmp_path, names, **kw):
    repo = git.Repo(tree.path)
    wls = [workload.load(n) for n in names]
    return verify.verify(repo, base_ref="patchkit-baseline", workloads=wls, out_dir=tmp_path, ui=UI(quiet=True), **kw)


def assert_one_victim(res, name="overflow-4", victim=3):
    wr = next(r for r in res.results if r.workload.name == name)
    for c in wr.candidate:
        errored = [o for o in c.outcomes if o.outcome == "errored"]
        assert [o.slot for o in errored] == [victim] and errored[0].error == EXCEEDED
        ev = [e for e in c.events if e.kind == "evict"]
        assert len(ev) == 1 and ev[0].victim == victim
        assert ev[0].cells > max(cells for _, cells in ev[0].others), "the victim held the most cells"
        for o in c.outcomes:
            if o.slot != victim:
                assert o.outcome == "completed" and len(o.tokens) == 240
        assert c.alive_after and c.followup_ok


def test_patched_c2_suite(c2, c2_base, tmp_path):
    """The default layout: base shows the bug, candidate passes every expectation, stable over repeats."""
    res = run(c2, tmp_path, verify.SUITE, repeat=2)
    failed = [(v.workload, v.side, v.run_index, c.name, c.detail) for r in res.results for v in r.verdicts
              for c in v.checks if c.status == "fail"]
    assert res.ok, failed
    assert res.layout == "C2"
    assert_one_victim(res)
    assert (tmp_path / "logs").is_dir()


def test_patched_d_overflow_4(trees, tmp_path):
    """Layout D: a second full build (its own cold build, then a TU rebuild for the candidate)."""
    res = run(trees("0.3.36"), tmp_path, ["overflow-4"])
    assert res.ok and res.layout == "D"
    assert_one_victim(res)


@pytest.mark.parametrize("name", ["victim-first", "victim-middle"])
def test_integrity_oracle_catches_missing_remap(c2, c2_base, tmp_path, name):
    """Prove the oracle can fail: the no-remap variant is caught in every run."""
    res = run(c2, tmp_path, [name], repeat=2, variant="no-remap")
    wr = res.results[0]
    assert all(v.ok for v in wr.verdicts if v.side == "base")
    for v in (v for v in wr.verdicts if v.side == "candidate"):
        integrity = next(c for c in v.checks if c.name == "integrity")
        assert integrity.status == "fail", f"run {v.run_index}: a missing remap went unnoticed"
    assert not res.ok


def test_speculative_workload_is_unchanged_by_the_patch(c2, c2_base, tmp_path):
    """With drafts on, upstream fails straddling slots before n_batch reaches 1 (see the workload's
    sizing note): the patch must not change a thing."""
    res = run(c2, tmp_path, ["speculative"])
    assert res.ok, [(v.side, c.name, c.detail) for v in res.results[0].verdicts for c in v.checks if not c.ok]
    log = (tmp_path / "logs" / "speculative.base.0.log").read_text()
    assert "draft acceptance" in log, "the draft model must actually speculate"


def test_sanitizer_build_runs_overflow_workloads_clean(c2, tmp_path):
    """The patched tree built with the tree's own ASan+UBSan options: zero findings (cost printed)."""
    import time

    from toolkit import apply, build, compare, model

    repo = git.Repo(c2.path)
    sha, _ = apply.candidate_commit(repo, c2.commit)
    t = time.monotonic()
    built = build.build(repo, sha, build.Options(sanitize=("address", "undefined")))
    cost = time.monotonic() - t
    starts = {}
    for name in ["overflow-4", "victim-first", "overflow-8", "fits"]:
        wl = workload.load(name)
        r = runner.run(built.binary, model.ensure().path, wl, tmp_path / f"{name}.log")
        v = compare.judge(wl, "candidate", r)
        assert not r.sanitizer, r.sanitizer
        assert all(c.status != "fail" for c in v.checks), [(c.name, c.detail) for c in v.checks if not c.ok]
        starts[name] = r.attempts
    print(f"sanitizer build: {cost:.0f} s ({'cached' if built.reused else 'built'}); server starts {starts}")
