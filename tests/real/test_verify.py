"""Issue 3/4: patched builds on real binaries, the suite, and oracles that are proven able to fail."""
from pathlib import Path
from types import SimpleNamespace
import re

import git
import pytest

from toolkit import build, compare, measure, proc, runner, verify, workload
from toolkit.compare import EXCEEDED
from toolkit.ui import UI


def run(tree, tmp_path, names, **kw):
    repo = git.Repo(tree.path)
    wls = [workload.load(n) for n in names]
    return verify.verify(repo, base_ref="patchkit-baseline", workloads=wls, out_dir=tmp_path, ui=UI(quiet=True), **kw)


def assert_one_victim(res, name="overflow-4"):
    """Measured, not read from the patch's log nor from the workload's sizing arithmetic (a skewed
    start can make another slot the largest): exactly one slot terminated on a full pool, the one
    that measurably held the most cells, survivors complete with every token, and the patch's
    log agrees."""
    wr = next(r for r in res.results if r.workload.name == name)
    n_predict = {q.slot: q.n_predict for q in wr.workload.requests}
    verdicts = [v for v in wr.verdicts if v.side == "candidate"]
    assert len(verdicts) == len(wr.candidate) > 0
    for c, v in zip(wr.candidate, verdicts):
        checks = {ch.name: ch for ch in v.checks}
        for check in ("one-victim-per-overflow", "victim-is-largest", "witness-agrees", "survivors-complete"):
            assert checks[check].status == "pass", (name, v.run_index, check, checks[check].detail)
        ev, = measure.overflows(c, wr.workload)
        assert ev.full and len(ev.expected) == 1, ev.describe()
        victim = ev.expected[0]  # the measured largest
        assert ev.margin > ev.uncertainty, "the victim held the most cells, beyond the measurement's doubt"
        errored = [o for o in c.outcomes if o.outcome == "errored"]
        assert [o.slot for o in errored] == [victim] and errored[0].error == EXCEEDED, ev.describe()
        assert ev.terminated == (victim,)
        logged = [e for e in c.events if e.kind == "evict"]
        assert [(e.victim, e.off) for e in logged] == [(victim, ev.off)], "the patch's log agrees"
        for o in c.outcomes:
            if o.slot != victim:
                assert o.outcome == "completed" and len(o.tokens) == n_predict[o.slot]
        assert c.alive_after and c.followup_ok


def test_patched_c2_suite(c2, c2_base, tmp_path):
    """The default layout: base shows the bug, candidate passes every expectation, stable over repeats."""
    res = run(c2, tmp_path, verify.SUITE, repeat=2)
    failed = [(v.workload, v.side, v.run_index, c.name, c.detail) for r in res.results for v in r.verdicts
              for c in v.checks if c.status == "fail"]
    assert res.ok, failed
    assert res.layout == "C2"
    # every shape and every pair is a workload's by design, reached in both repeats (a start
    # that missed its designed offset is made again, so a late request cannot lose one)
    from toolkit import coverage
    missed = [(c.shape, c.repeats, c.of) for c in (*res.coverage, *res.pairs)
              if c.shape in (*coverage.EVICTION, *coverage.PAIRS) and c.repeats < c.of]
    assert res.outcome == "PASS" and not missed, missed
    assert_one_victim(res)
    assert (tmp_path / "logs").is_dir()


def test_patched_d_overflow_4(trees, tmp_path):
    """Layout D: a second full build (its own cold build, then a TU rebuild for the candidate)."""
    res = run(trees("0.3.36"), tmp_path, ["overflow-4", "victim-first", "victim-middle"], repeat=2)
    assert res.ok and res.layout == "D", [(v.workload, v.side, c.name, c.detail) for r in res.results
                                          for v in r.verdicts for c in v.checks if c.status == "fail"]
    for name in ("overflow-4", "victim-first", "victim-middle"):
        assert_one_victim(res, name)


LAYOUTS = {"C2": "0.3.35", "D": "0.3.36"}


@pytest.mark.parametrize("layout", ["C2", "D"])
def test_integrity_oracle_catches_missing_remap(trees, tmp_path, layout):
    """Prove the oracle can fail, for the right reason, on every run: without the index remap the
    survivors after the victim diverge from the control right after the eviction, on runs that
    measurably had to shift them."""
    res = run(trees(LAYOUTS[layout]), tmp_path, ["victim-first", "victim-middle"], repeat=2, variant="no-remap")
    assert res.layout == layout
    for wr in res.results:
        assert all(v.ok for v in wr.verdicts if v.side == "base")
        for v, c in zip((v for v in wr.verdicts if v.side == "candidate"), wr.candidate):
            checks = {ch.name: ch for ch in v.checks}
            assert checks["shift-exercised"].status == "pass", checks["shift-exercised"].detail
            assert checks["victim-is-largest"].status == "pass" and checks["witness-agrees"].status == "pass"
            integrity = checks["integrity"]
            ev, = measure.overflows(c, wr.workload)
            victim = ev.at(ev.terminated[0])
            shifted = {s.slot: s.generated for s in ev.in_play if s.position > victim.position}
            assert integrity.status == "fail", f"{wr.workload.name} run {v.run_index}: a missing remap went unnoticed"
            assert "control did not complete" not in integrity.detail
            # the reason: a survivor whose entry sat after the victim's sampled from a stale row in the
            # eviction step, i.e. its stream differs first at exactly the token of that step
            at = {int(m[0]): int(m[1]) for m in re.findall(r"slot (\d+): differs from control at token (\d+)",
                                                             integrity.detail)}
            assert at and set(at) <= set(shifted), (integrity.detail, shifted)
            assert all(at[slot] == shifted[slot] for slot in at), (integrity.detail, shifted)
            # and upstream's own log shows the stale index whatever the tokens: a shifted slot was
            # not sampled in the eviction step and decoded its previous token again
            sampled = checks["one-sample-per-entry"]
            missed = {int(m) for m in re.findall(r"slot (\d+): decode #\d+ entered token \d+, but its sample", sampled.detail)}
            assert sampled.status == "fail" and missed and missed <= set(shifted), (sampled.detail, shifted)
            assert "the previous token again" in sampled.detail
    assert not res.ok


def assert_false_witness(run, wl):
    """Why the verdict failed, from the measurement: a slot other than the measured largest was
    terminated, and the patch's log claims more cells for it than it measurably held."""
    evs = measure.overflows(run, wl)
    wrong = [e for e in evs if len(e.terminated) == 1 and e.terminated[0] not in e.expected]
    assert wrong, [e.describe() for e in evs]
    logged = [e for e in run.events if e.kind == "evict"]
    lies = [(lg.victim, lg.cells, ev.at(lg.victim).cells) for lg, ev in zip(logged, evs)
            if ev.at(lg.victim) is not None and lg.cells > ev.at(lg.victim).cells + ev.at(lg.victim).spread]
    assert lies, ([(lg.victim, lg.cells) for lg in logged], [e.describe() for e in evs])


@pytest.mark.parametrize("layout", ["C2", "D"])
def test_false_witness_fails_every_overflow_workload(trees, tmp_path, layout):
    """A patch that evicts the runner-up and logs it as the largest: caught by measurement on every
    overflow workload, and its log contradicted (a verdict that read the log would pass it)."""
    names = ["overflow-4", "overflow-8", "overflow-nonstream", "staggered", "victim-first", "victim-middle"]
    res = run(trees(LAYOUTS[layout]), tmp_path, names, variant="false-witness")
    for wr in res.results:
        for v in (v for v in wr.verdicts if v.side == "candidate"):
            checks = {c.name: c for c in v.checks}
            assert checks["victim-is-largest"].status == "fail", (wr.workload.name, checks["victim-is-largest"])
            assert checks["witness-agrees"].status == "fail", (wr.workload.name, checks["witness-agrees"])
            assert_false_witness(wr.candidate[v.run_index], wr.workload)
    assert not res.ok


def test_speculative_workload_is_unchanged_by_the_patch(c2, c2_base, tmp_path):
    """With drafts on, upstream fails straddling slots before n_batch reaches 1 (see the workload's
    sizing note): the patch must not change a thing."""
    res = run(c2, tmp_path, ["speculative"])
    assert res.ok, [(v.side, c.name, c.detail) for v in res.results[0].verdicts for c in v.checks if not c.ok]
    log = (tmp_path / "logs" / "speculative.base.0.log").read_text()
    assert "draft acceptance" in log, "the draft model must actually speculate"




def test_sanitizer_build_runs_overflow_workloads_clean(c2, tmp_path):
    """The patched tree with ASan+UBSan on the TU the patch changes and on the KV cache it frees
    cells in: zero findings (cost printed). Scoped, so every other TU is the plain candidate
    build's object from ccache: the tree's own options (llama, common and the whole server)
    took ~20 min cold on 2 cores, the whole server's TUs alone ~11 min beside a test run."""
    import time

    from toolkit import apply, compare, model

    from .conftest import sanitized_build

    repo = git.Repo(c2.path)
    sha, _ = apply.candidate_commit(repo, c2.commit)
    t = time.monotonic()
    out = sanitized_build(c2, sha)
    cost = time.monotonic() - t
    built = SimpleNamespace(binary=Path(out["binary"]), reused=out["reused"])
    assert out["commit"] == sha
    # the scope took: the patched TU's object calls ASan's checks, an out-of-scope one does not
    objs = {o.name: o for o in Path(out["compile_commands"]).parent.rglob("*.o")}
    assert "__asan_report" in proc.run(["nm", objs["server-context.cpp.o"]]).out
    assert "__asan_report" not in proc.run(["nm", objs["llama-model.cpp.o"]]).out
    starts = {}
    for name in ["overflow-4", "victim-first", "overflow-8", "fits"]:
        wl = workload.load(name)
        r = runner.run(built.binary, model.ensure().path, wl, tmp_path / f"{name}.log")
        v = verify.judge(wl, "candidate", r)
        assert not r.sanitizer, r.sanitizer
        assert all(c.status != "fail" for c in v.checks), [(c.name, c.detail) for c in v.checks if not c.ok]
        # the check had something to testify with: the runtimes, measured from the binary
        san = next(c for c in v.checks if c.name == "no-sanitizer-findings")
        assert r.sanitized == ("address", "undefined") and san.status == "pass", (r.sanitized, san)
        starts[name] = r.attempts
    print(f"sanitizer build: {cost:.0f} s ({'cached' if built.reused else 'built'}); server starts {starts}")


def test_checks_without_evidence_skip_or_fail_never_pass(c2, c2_base, c2_patched, tmp_path):
    """Issue 26 item 5, on real runs. A plain binary carries no sanitizer runtime, so
    `no-sanitizer-findings` is skipped (and the summary line names it); patchkit's own eviction
    whose log line was reworded cannot testify, so `witness-agrees` fails, for that reason only."""
    import json
    import subprocess
    import sys

    from toolkit import apply, compare, model, patch

    from .conftest import commit_on

    repo = git.Repo(c2.path)
    r = runner.run(c2_patched.binary, model.ensure().path, workload.load("overflow-4"), tmp_path / "plain.log")
    assert r.sanitized == ()
    v = verify.judge(workload.load("overflow-4"), "candidate", r, own=compare.Promises(witness=True))
    checks = {c.name: c for c in v.checks}
    assert checks["no-sanitizer-findings"].status == "skip", checks["no-sanitizer-findings"]
    assert "carries no sanitizer runtime" in checks["no-sanitizer-findings"].detail
    assert checks["witness-agrees"].status == "pass", checks["witness-agrees"]

    # the right patch, its one log line reworded, committed as patchkit's series (its trailer kept)
    right, an = apply.candidate_commit(repo, c2.commit)
    text = repo.git.show(f"{right}:{an.file}")
    assert text.count("KV cache is full: terminating slot") == 1
    reworded = commit_on(repo, c2.commit, {an.file: text.replace("KV cache is full: terminating slot",
                                                                 "KV cache full; ending slot") + "\n"},
                         f"server: reworded eviction line\n\n{apply.TRAILER_PATCH}: {patch.DEFAULT_PATCH} policy=largest\n")
    res = subprocess.run([sys.executable, "-m", "toolkit", "verify", "--repo", str(c2.path), "--base", c2.commit,
                          "--candidate", reworded, "--workload", "overflow-4", "--report-dir", str(tmp_path / "out")],
                         capture_output=True, text=True)
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    fails = {c["name"]: c["detail"] for v in rep["workloads"]["overflow-4"]["verdicts"] if v["side"] == "candidate"
             for c in v["checks"] if c["status"] == "fail"}
    assert set(fails) == {"witness-agrees"}, fails
    assert "no eviction line of the patch could be read" in fails["witness-agrees"]
    # the summary line shows what was skipped, by name, and what failed
    line = next(x for x in res.stdout.splitlines() if "checks passed" in x)
    assert "skipped: " in line and "no-sanitizer-findings x" in line and "1 failed: witness-agrees" in line, line


def test_a_jobs_second_verify_reads_the_base_runs_back_and_makes_the_candidates(c2, c2_base, c2_patched, tmp_path):
    """PATCHKIT_SHARED_RUNS through the command a CI job types: the first verify against a base makes
    its control and base runs, the second reads them back (same verdict), the candidate's are made
    by both; without the variable nothing is read back."""
    import os
    import subprocess
    import sys

    def verify_cli(shared: str | None, k: int):
        env = {k: v for k, v in os.environ.items() if k != runner.SHARED_ENV}
        if shared:
            env[runner.SHARED_ENV] = shared
        return subprocess.run([sys.executable, "-m", "toolkit", "verify", "--workload", "victim-first",
                               "--report-dir", str(tmp_path / f"r{k}")], capture_output=True, text=True, env=env)
    jobs = str(tmp_path / "job")
    first, second, alone = verify_cli(jobs, 1), verify_cli(jobs, 2), verify_cli(None, 3)
    for res in (first, second, alone):
        assert res.returncode == 0, res.stderr[-2000:]
    said = [res.stdout + res.stderr for res in (first, second, alone)]
    assert verify.SHARED_NOTE.strip() not in said[0] and verify.SHARED_NOTE.strip() not in said[2]
    assert said[1].count(verify.SHARED_NOTE.strip()) == 2, said[1][-3000:]   # the control, the base run
    uses = [line.split()[:2] for line in (tmp_path / "job" / "ledger").read_text().splitlines()]
    assert uses == [["made", "control"], ["made", "base"], ["made", "candidate"],
                    ["read", "control"], ["read", "base"], ["made", "candidate"]], uses
    import json
    a, b = (json.loads((tmp_path / f"r{k}" / "report.json").read_text()) for k in (1, 2))
    wa, wb = a["workloads"]["victim-first"], b["workloads"]["victim-first"]
    assert wa["base"] == wb["base"] and wa["control"] == wb["control"], "read back, not made again"
    assert wa["candidate"][0]["log"] != wb["candidate"][0]["log"], "each verify makes its candidate's runs"
