#!/usr/bin/env python3
"""The mutation campaign's cost: prints figures, asserts nothing (tests stay deterministic).

    python bench/mutants.py [--repo TREE] [--mutant NAME ...] [--hogs N]

Measures, on one tree (default: the fetched C2 tree), one after the other:
  - one TU compile of the patched server (`patchkit check`'s compile);
  - one suite run of the right patch (`verify`'s default suite, base + candidate + controls);
  - the campaign (`patchkit mutants`), per mutant (base runs and controls made once, shared).
With --hogs N, N `yes > /dev/null` processes run beside it (a busy machine) and are stopped by
their PIDs at the end. Cold per mutant: the mutants' stored binaries are set aside first and
ccache is off (CCACHE_DISABLE), so each mutant pays its TU compile, as on a first campaign.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def timed(fn):
    t = time.monotonic()
    out = fn()
    return out, time.monotonic() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", default=None)
    ap.add_argument("--mutant", action="append", default=[])
    ap.add_argument("--hogs", type=int, default=0)
    a = ap.parse_args()

    import git

    from toolkit import apply, check, mutate, source, verify, workload

    repo = git.Repo(a.repo) if a.repo else git.Repo(source.fetch().path)
    base = source.resolve(repo, None if a.repo else source.BASELINE_TAG)
    import os
    import shutil

    from toolkit import build
    os.environ["CCACHE_DISABLE"] = "1"
    names = a.mutant or list(mutate.catalog())
    for n in names:  # each mutant's binary is built again: a first campaign's cost
        sha, _ = apply.candidate_commit(repo, base, variant=n)
        shutil.rmtree(build.binary_store(repo.commit(sha).tree.hexsha, build.Options()), ignore_errors=True)
    hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(a.hogs)]
    try:
        cand, _ = apply.candidate_commit(repo, base)
        ck, _ = timed(lambda: check.check(repo, cand))
        wls = [workload.load(w) for w in verify.SUITE + mutate.EXTRA]
        with tempfile.TemporaryDirectory() as tmp:
            res, t_suite = timed(lambda: verify.run_suite(repo, base, cand, wls, work_dir=Path(tmp) / "suite",
                                                          expect="eviction", evicting_patch=True,
                                                          say=lambda s: None))
            out, t_all = timed(lambda: mutate.campaign(repo, base, names, wls, out_dir=Path(tmp) / "m",
                                                       say=lambda s: None))
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    print(f"tree {repo.working_tree_dir} base {base[:12]}, {a.hogs} CPU hog(s) beside")
    print(f"one TU compile (check)                  {ck.compile_s:7.1f} s")
    print(f"one suite run, right patch ({len(wls)} workloads) {t_suite:7.1f} s  (verdict {'PASS' if res.ok else 'FAIL'})")
    per = [r.seconds for r in out]
    print(f"campaign, {len(out)} mutants                  {t_all:7.1f} s  ({t_all / len(out):.1f} s per mutant; "
          f"min {min(per):.1f}, max {max(per):.1f})")
    print(f"per mutant / (TU compile + suite run)   {t_all / len(out) / (ck.compile_s + t_suite):7.2f}")
    killed, judged = mutate.score(out)
    print(f"mutation score {killed}/{judged}")
    print(json.dumps({r.name: [r.status, round(r.seconds, 1)] for r in out}))


if __name__ == "__main__":
    main()
