"""How much a server's verbose log grows while no request receives anything, measured: the
figure runner.QUIET_CAP rests on (a server looping without progress is cut past it).

Runs every family's default suite (`patchkit verify --patch F`, base and candidate, each start
measured by runner.Flood) on a tree, then its users' traffic (`patchkit traffic --patch F`: every
workload of fixtures/traffic, base and candidate, the same Flood over what any user sent or
received), and prints per workload the largest log and the most it grew while nothing was
received, over every run of every family, with the family where it was seen. A benchmark prints
figures; it asserts nothing.

    python bench/log_quiet.py [--version 0.3.35] [--family F ...] [--no-traffic]
"""
from __future__ import annotations

import argparse
import json
import subprocess
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


def traffic_runs(tree: Path, family: str, out: Path):
    """(workload, log bytes, quiet bytes) of every traffic run `patchkit traffic --patch family` made."""
    res = subprocess.run([sys.executable, "-m", "toolkit", "traffic", "--repo", str(tree), "--base", source.BASELINE_TAG,
                          "--patch", family, "--report-dir", str(out)],
                         cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True)
    if not (out / "traffic.json").exists():
        raise SystemExit(f"patchkit traffic --patch {family} wrote no report (exit {res.returncode}):\n{res.stderr[-2000:]}")
    for w in json.loads((out / "traffic.json").read_text())["workloads"]:
        for runs in w["sides"].values():
            for s in runs:
                yield f"traffic {w['traffic']}", s["log_bytes"], s["log_quiet_bytes"]


def table(seen) -> list[str]:
    """The printed table from (workload, log bytes, quiet bytes, family): per workload its largest
    log and its most quiet growth (with the family that showed it), the most first; then the most
    against runner.QUIET_CAP."""
    by: dict[str, tuple[float, float, str]] = {}   # workload -> (largest log, most quiet growth, family)
    for wl, size, quiet, family in seen:
        old = by.get(wl, (0.0, -1.0, ""))
        q = quiet / 2**20
        by[wl] = (max(old[0], size / 2**20), max(old[1], q), family if q > old[1] else old[2])
    lines = [f"{'workload':28} {'largest log':>12} {'most while no request received anything':>42}  (family)"]
    for wl, (size, quiet, fam) in sorted(by.items(), key=lambda kv: (-kv[1][1], kv[0])):
        lines.append(f"{wl:28} {size:9.1f} MB {quiet:39.2f} MB  ({fam})")
    top = max((q for _, q, _ in by.values()), default=0.0)
    lines.append(f"most: {top:.2f} MB; runner.QUIET_CAP is {runner.QUIET_CAP >> 20} MB ({runner.QUIET_CAP / 2**20 / top:.0f}x)"
                 if top > 0 else f"most: 0 MB; runner.QUIET_CAP is {runner.QUIET_CAP >> 20} MB" if by else "no run measured")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", default=source.DEFAULT_VERSION, help="the llama-cpp-python sdist's tree")
    ap.add_argument("--family", action="append", help="default: every family patchkit ships")
    ap.add_argument("--no-traffic", action="store_true", help="the laboratory suites only")
    args = ap.parse_args()
    tree = source.fetch(version=args.version, progress=lambda s: None)
    repo = git.Repo(tree.path)
    out = Path(tempfile.mkdtemp(prefix="patchkit-log-quiet-"))
    seen: list[tuple[str, int, int, str]] = []
    for family in args.family or patch.families():
        res = verify.verify(repo, base_ref=source.BASELINE_TAG, patch_name=family,
                            workloads=[workload.load(w) for w in verify.SUITE], out_dir=out / family, ui=UI(quiet=True))
        seen += [(r.workload, r.log_bytes, r.log_quiet, family) for r in runs(res)]
        print(f"{family}: {res.outcome}", flush=True)
        if not args.no_traffic:
            seen += [(*t, family) for t in traffic_runs(tree.path, family, out / family / "traffic")]
    print("\n" + "\n".join(table(seen)))
    print(f"reports: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
