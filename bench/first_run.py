#!/usr/bin/env python3
"""A new user's first run, measured: prints figures, asserts nothing.

    python bench/first_run.py [demo] [test] [--cache DIR]

A fresh HOME (so an empty patchkit cache, ccache and pip cache), a fresh venv and a fresh clone
of this checkout's HEAD; then the README's commands (`bash ci/run.sh demo`, `bash ci/run.sh
test`) in the order given, every output line (stdout and stderr, merged) timestamped into
first-run.log. Printed per command: wall time, exit code, the longest silences with the line
before and after each, and every line a user would read as a failure (a traceback, a `fatal:`);
for `test`, pytest's 30 slowest phases (a `setup` row is a shared fixture's build, a `call` row a
test's own run) and the session's line on the runs it shared (tests/conftest.py, PATCHKIT_SHARED_RUNS).

--cache DIR: PATCHKIT_CACHE (default: under the fresh HOME, i.e. empty). Run it alone: a second
job beside it changes every figure.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALARMING = re.compile(r"(Traceback \(most recent call last\)|^fatal:|[^:]fatal:|Exception in thread)")


def run(cmd: list[str], cwd: Path, env: dict, log, t0: float) -> dict:
    start = last = time.monotonic()
    prev = "(start)"
    gaps, alarms, durations = [], [], []
    in_durations = False
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         errors="replace", bufsize=1)
    for line in p.stdout:
        now = time.monotonic()
        line = line.rstrip("\n")
        gaps.append((now - last, prev, line))
        log.write(f"{now - t0:9.1f} +{now - last:6.1f}  {line}\n")
        log.flush()
        if ALARMING.search(line):
            alarms.append(line)
        # pytest's --durations block: setup rows are the fixtures' builds, call rows the tests
        if re.search(r"slowest \d+ durations", line):
            in_durations = True
        elif in_durations and line.startswith("="):
            in_durations = False
        if in_durations or line.startswith("runs shared by this session:"):
            durations.append(line)
        last, prev = now, line
    rc = p.wait()
    end = time.monotonic()
    gaps.append((end - last, prev, "(end)"))
    return {"cmd": " ".join(cmd), "rc": rc, "seconds": end - start, "lines": len(gaps) - 1,
            "gaps": sorted(gaps, reverse=True)[:5], "alarms": alarms,
            "durations": durations}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("commands", nargs="*", default=["demo", "test"], choices=["demo", "test"])
    ap.add_argument("--cache", type=Path, default=None, help="PATCHKIT_CACHE (default: empty, under the fresh HOME)")
    args = ap.parse_args()

    top = Path(tempfile.mkdtemp(prefix="patchkit-first-run-"))
    home, clone, venv = top / "home", top / "clone", top / "venv"
    home.mkdir()
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PATCHKIT_", "CCACHE_", "PIP_", "XDG_", "VIRTUAL_ENV"))}
    env.update(HOME=str(home), PATH=f"{venv / 'bin'}:{env['PATH']}", PYTHON=str(venv / "bin" / "python"),
               VIRTUAL_ENV=str(venv))
    if args.cache:
        env["PATCHKIT_CACHE"] = str(args.cache.resolve())
    print(f"fresh HOME {home}, venv {venv}, clone {clone} (HEAD {subprocess.run(['git', '-C', clone, 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True).stdout.strip()})")
    results = []
    t0 = time.monotonic()
    with open(top / "first-run.log", "w") as log:
        for c in args.commands:
            log.write(f"==== bash ci/run.sh {c}\n")
            extra = ["--durations=30"] if c == "test" else []
            results.append(run(["bash", "ci/run.sh", c, *extra], clone, env, log, t0))
    for r in results:
        print(f"\n{r['cmd']}: exit {r['rc']}, {r['seconds']:.1f} s, {r['lines']} lines, "
              f"{len(r['alarms'])} alarming line(s)")
        for a in r["alarms"][:10]:
            print(f"  alarming: {a[:160]}")
        print("  longest silences:")
        for gap, before, after in r["gaps"]:
            print(f"    {gap:6.1f} s  after: {before[:110]}\n{'':17}before: {after[:110]}")
        for d in r["durations"]:
            print(f"  {d}")
    print(f"\nlog: {top / 'first-run.log'} (the fresh HOME, venv and clone are kept beside it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
