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
import logging
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import git  # noqa: E402

from toolkit import patch, runner, source, verify, workload  # noqa: E402
from toolkit.ui import UI  # noqa: E402

LINE = re.compile(r"^(\S+): start \d+, [\d.]+ s, log ([\d.]+) MB \(([\d.]+) MB at most while no request")


class Seen(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.family = ""
        self.by: dict[str, tuple[float, float, str]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if m := LINE.match(record.getMessage()):
            wl, size, quiet = m[1], float(m[2]), float(m[3])
            old = self.by.get(wl, (0.0, 0.0, ""))
            self.by[wl] = (max(old[0], size), max(old[1], quiet), self.family if quiet >= old[1] else old[2])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", default=source.DEFAULT_VERSION, help="the llama-cpp-python sdist's tree")
    ap.add_argument("--family", action="append", help="default: every family patchkit ships")
    args = ap.parse_args()
    tree = source.fetch(version=args.version, progress=lambda s: None)
    repo = git.Repo(tree.path)
    seen = Seen()
    logging.getLogger().addHandler(seen)
    logging.getLogger().setLevel(logging.INFO)
    out = Path(tempfile.mkdtemp(prefix="patchkit-log-quiet-"))
    for family in args.family or patch.families():
        seen.family = family
        res = verify.verify(repo, base_ref=source.BASELINE_TAG, patch_name=family,
                            workloads=[workload.load(w) for w in verify.SUITE], out_dir=out / family, ui=UI(quiet=True))
        print(f"{family}: {res.outcome}", flush=True)
    print(f"\n{'workload':28} {'largest log':>12} {'most while no request received anything':>42}  (family)")
    for wl, (size, quiet, fam) in sorted(seen.by.items(), key=lambda kv: -kv[1][1]):
        print(f"{wl:28} {size:9.1f} MB {quiet:39.2f} MB  ({fam})")
    top = max((q for _, q, _ in seen.by.values()), default=0.0)
    print(f"\nmost: {top:.2f} MB; runner.QUIET_CAP is {runner.QUIET_CAP >> 20} MB "
          f"({runner.QUIET_CAP / 2**20 / top:.0f}x)" if top else "\nno run measured")
    print(f"reports: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
