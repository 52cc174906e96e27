#!/usr/bin/env python3
"""The referee's traffic rows: every strategy on the same chat traffic, measured. Prints figures,
asserts nothing.

    python bench/traffic_referee.py [--repeat 5] [--workload NAME]... [--patch NAME]...

Default tree and base; each patch family (evict-largest-slot = terminate, park-slot,
recompute-slot, hybrid-slot) is applied, built (cached), and served each traffic workload
`--repeat` times; each turn is compared with its solo control on the base. Per workload: a row
per strategy (outcome, goodput and p99 latency as median [min-max], runs with every turn exact,
failed attempts), and only the claims the runs allow (toolkit/referee.py's claims()).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import git

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from toolkit import apply, build, patch as patch_mod, source, traffic  # noqa: E402

FAMILIES = ["evict-largest-slot", "park-slot", "recompute-slot", "hybrid-slot"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workload", action="append", default=None)
    ap.add_argument("--patch", action="append", default=None)
    ap.add_argument("--out", type=Path, default=Path("patchkit-traffic-referee"))
    args = ap.parse_args()
    tree = source.fetch(progress=lambda s: None)
    repo = git.Repo(tree.path)
    base = tree.commit
    base_bin = build.build(repo, base).binary
    bins = {}
    for fam in args.patch or FAMILIES:
        sha, _ = apply.candidate_commit(repo, base, fam)
        bins[fam] = build.build(repo, sha).binary
    for name in args.workload or traffic.available():
        t = traffic.load(name)
        by = {}
        for fam, b in bins.items():
            promise = "preemption" if patch_mod.load_patch(fam).expect == "preemption" else "one-victim"
            res = traffic.compare(base_bin, b, t, args.out / fam, promise=promise, with_base=False,
                                  repeat=args.repeat)
            by[fam] = res.candidate
        print("\n".join(traffic.referee_rows(t, by)))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
