#!/usr/bin/env python3
"""Verdicts on a busy machine: prints figures, asserts nothing.

    python bench/load.py [--runs 5] [--hogs 2] [--repeat 3]

Runs `bash ci/run.sh demo` once idle, then --runs times while --hogs CPU hogs run beside it
(`stress-ng --cpu N` when installed, else N `yes > /dev/null`), then `patchkit verify --repeat R`
(the whole default suite) under the same load, then the two broken variants under that load
(`no-remap` on victim-first/-middle, `false-witness` on three overflow workloads): each must
be caught in every run. Prints each run's wall time, verdict, and the server starts it needed
(for a variant, PASS means "failed as it must"). Caches are the usual ones (run a demo first).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def hogs(n: int):
    if n <= 0:
        yield "idle"
        return
    if shutil.which("stress-ng"):
        procs = [subprocess.Popen(["stress-ng", "--cpu", str(n), "--quiet"], start_new_session=True)]
        what = f"stress-ng --cpu {n}"
    else:
        procs = [subprocess.Popen("yes > /dev/null", shell=True, start_new_session=True) for _ in range(n)]
        what = f"{n} x yes > /dev/null"
    try:
        time.sleep(1)
        yield what
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def timed(argv: list[str], report_dir: Path) -> tuple[float, int, str]:
    t = time.monotonic()
    rc = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                        env=dict(os.environ, PYTHONPATH=str(ROOT))).returncode
    wall = time.monotonic() - t
    return wall, rc, summary(report_dir / "report.json")


def summary(path: Path) -> str:
    if not path.exists():
        return "no report"
    data = json.loads(path.read_text())
    runs = [r for w in data["workloads"].values() for r in w["base"] + w["candidate"]]
    failed = sorted({f"{name}:{c['name']}" for name, w in data["workloads"].items() for v in w["verdicts"]
                     for c in v["checks"] if c["status"] == "fail"})
    return (f"{sum(r['attempts'] for r in runs)} server starts for {len(runs)} runs"
            + (f"; failed {failed}" if failed else ""))


def caught(path: Path, check: str) -> str:
    """How many candidate runs of a broken variant failed `check` (they all should)."""
    if not path.exists():
        return "no report"
    runs = [v for w in json.loads(path.read_text())["workloads"].values() for v in w["verdicts"]
            if v["side"] == "candidate"]
    hit = sum(any(c["name"] == check and c["status"] == "fail" for c in v["checks"]) for v in runs)
    return f"caught by {check} in {hit}/{len(runs)} candidate runs"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--hogs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="patchkit-load-"))
    demo = lambda d: ["bash", "ci/run.sh", "demo", "--report-dir", str(d)]  # noqa: E731
    rows = []
    with hogs(0):
        wall, rc, s = timed(demo(out / "idle"), out / "idle")
        rows.append(("demo, idle", wall, rc, s))
    with hogs(args.hogs) as what:
        for k in range(args.runs):
            d = out / f"loaded-{k}"
            wall, rc, s = timed(demo(d), d)
            rows.append((f"demo {k + 1}/{args.runs}, {what}", wall, rc, s))
        d = out / "verify"
        wall, rc, s = timed([sys.executable, "-m", "toolkit", "verify", "--repeat", str(args.repeat),
                             "--report-dir", str(d)], d)
        rows.append((f"verify --repeat {args.repeat}, {what}", wall, rc, s))
        for variant, names, check in (("no-remap", ["victim-first", "victim-middle"], "integrity"),
                                      ("false-witness", ["overflow-4", "victim-first", "staggered"],
                                       "victim-is-largest")):
            d = out / variant
            argv = [sys.executable, "-m", "toolkit", "verify", "--variant", variant, "--repeat", str(args.repeat),
                    "--report-dir", str(d)] + [a for n in names for a in ("--workload", n)]
            wall, rc, _ = timed(argv, d)
            rows.append((f"--variant {variant}, {what}", wall, 0 if rc == 1 else rc, caught(d / "report.json", check)))
    for name, wall, rc, s in rows:
        print(f"{name:<44} {wall:7.1f} s  {'PASS' if rc == 0 else f'FAIL (exit {rc})':<14} {s}")
    print(f"reports under {out}")


if __name__ == "__main__":
    main()
