"""How much a server's verbose log grows while no request receives anything, measured: the
figure runner.QUIET_CAP rests on (a server looping without progress is cut past it).

Runs every family's default suite (`patchkit verify --patch F`, base and candidate, each start
measured by runner.Flood) on a tree, and prints per workload the largest log and the most it
grew between two receptions, over every run of every family, with the family where it was seen.
A benchmark prints figures; it asserts nothing.

    python bench/log_quiet.py [--version 0.3.35] [--family F ...]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import git  # noqa: E402

from toolkit import patch, runner, source, verify, workload  # noqa: E402
from toolkit.ui import UI  # noqa: E402


def runs(res: verify.Result):
    """Every run a verify made (base, control, candidate), each earlier start included."""
    for wr in res.results:
        for r in (*wr.base, *wr.candidate, *([wr.control] if wr.control else [])):
            yield from (*r.earlier, r)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", default=source.DEFAULT_VERSION, help="the llama-cpp-python sdist's tree")
    ap.add_argument("--family", action="append", help="default: every family patchkit ships")
    args = ap.parse_args()
    tree = source.fetch(version=args.version, progress=lambda s: None)
    repo = git.Repo(tree.path)
    out = Path(tempfile.mkdtemp(prefix="patchkit-log-quiet-"))
    by: dict[str, tuple[float, float, str]] = {}   # workload -> (largest log, most quiet growth, family)
    for family in args.family or patch.families():
        res = verify.verify(repo, base_ref=source.BASELINE_TAG, patch_name=family,
                            workloads=[workload.load(w) for w in verify.SUITE], out_dir=out / family, ui=UI(quiet=True))
        for r in runs(res):
            size, quiet = r.log_bytes / 2**20, r.log_quiet / 2**20
            old = by.get(r.workload, (0.0, 0.0, ""))
            by[r.workload] = (max(old[0], size), max(old[1], quiet), family if quiet >= old[1] else old[2])
        print(f"{family}: {res.outcome}", flush=True)
    print(f"\n{'workload':28} {'largest log':>12} {'most while no request received anything':>42}  (family)")
    for wl, (size, quiet, fam) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"{wl:28} {size:9.1f} MB {quiet:39.2f} MB  ({fam})")
    top = max((q for _, q, _ in by.values()), default=0.0)
    print(f"\nmost: {top:.2f} MB; runner.QUIET_CAP is {runner.QUIET_CAP >> 20} MB "
          f"({runner.QUIET_CAP / 2**20 / top:.0f}x)" if top else "\nno run measured")
    print(f"reports: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
