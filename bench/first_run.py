#!/usr/bin/env python3
"""A new user's first run, measured: prints figures, asserts nothing.

    python bench/first_run.py [demo] [test] [--cache DIR]
    python bench/first_run.py --builds DIR      # only the build table of an existing cache

A fresh HOME (so an empty patchkit cache, ccache and pip cache), a fresh venv and a fresh clone
of this checkout's HEAD; then the README's commands (`bash ci/run.sh demo`, `bash ci/run.sh
test`) in the order given, every output line (stdout and stderr, merged) timestamped into
first-run.log. Printed per command: wall time, exit code, the longest silences with the line
before and after each, and every line a user would read as a failure (a traceback, a `fatal:`);
for `test`, pytest's 30 slowest phases (a `setup` row is a shared fixture's build, a `call` row a
test's own run) and the session's line on the runs it shared (tests/conftest.py, PATCHKIT_SHARED_RUNS).

After `test`, and alone with --builds: where the builds' time went, per build workspace (one per
tree history and flags), from its .ninja_log (ninja appends one line per step it ran): the steps
compiled (a step over 1 s: a ccache miss) and replayed (ccache hits), their summed seconds (steps
overlap: ninja runs several at once), the compiles of the patched TU (server-context.cpp), and
the longest TUs. Ninja compacts its log now and then (keeping each output's last step), so the
counts are at least what they say.

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


PATCHED_TU = "server-context.cpp.o"
MISS_S = 1.0   # a step this long compiled; a ccache hit replays in tens of ms (measured: 13-38 ms)


def builds(cache: Path, top: int = 5) -> list[str]:
    """The build table of a cache's workspaces (see the module's doc)."""
    rows, total = [], [0, 0, 0.0, 0]
    for log in sorted((cache / "work").glob("*/build/.ninja_log")):
        steps = []
        for line in log.read_text(errors="replace").splitlines()[1:]:
            f = line.split("\t")
            if len(f) == 5 and f[3].endswith((".o", ".obj")):
                steps.append(((int(f[1]) - int(f[0])) / 1000, f[3]))
        miss = [(s, t) for s, t in steps if s > MISS_S]
        secs = sum(s for s, _ in miss)
        tu = sum(t.endswith(PATCHED_TU) for s, t in miss)
        longest = sorted(miss, reverse=True)[:top]
        rows.append(f"  {log.parent.parent.name}: {len(miss)} compiled ({secs:.0f} s summed), "
                    f"{len(steps) - len(miss)} replayed by ccache, patched TU compiled {tu}x; longest: "
                    + ", ".join(f"{Path(t).name.removesuffix('.o')} {s:.0f} s" for s, t in longest))
        total = [total[0] + len(miss), total[1] + len(steps) - len(miss), total[2] + secs, total[3] + tu]
    return ([f"builds: {len(rows)} workspace(s) under {cache / 'work'}; {total[0]} compiled ({total[2]:.0f} s "
             f"summed), {total[1]} replayed, the patched TU compiled {total[3]}x"] + rows) if rows else \
        [f"builds: no workspace under {cache / 'work'}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("commands", nargs="*", help="demo and/or test (default: both)")
    ap.add_argument("--cache", type=Path, default=None, help="PATCHKIT_CACHE (default: empty, under the fresh HOME)")
    ap.add_argument("--builds", type=Path, default=None, metavar="DIR",
                    help="print the build table of the cache DIR (its work/*/build/.ninja_log) and stop")
    args = ap.parse_args()
    if args.builds:
        print("\n".join(builds(args.builds)))
        return 0
    # not argparse's choices: with nargs="*" it checks the empty list (and a list default) against them
    args.commands = args.commands or ["demo", "test"]
    if set(args.commands) - {"demo", "test"}:
        ap.error(f"unknown command(s) {sorted(set(args.commands) - {'demo', 'test'})}: choose demo and/or test")

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
    if "test" in args.commands:
        print("\n" + "\n".join(builds(Path(env.get("PATCHKIT_CACHE", home / ".cache" / "patchkit")))))
    print(f"\nlog: {top / 'first-run.log'} (the fresh HOME, venv and clone are kept beside it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
