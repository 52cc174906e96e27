"""Parks per request of a workload under the park families' rules, simulated (no server): how
many-resumes-8 was sized before it was measured. Prints figures; asserts nothing.

    python bench/park_schedule.py many-resumes-8 [--policy largest|smallest] [--bound 3]

The rules, as patches/park-slot/helper.cpp.j2 writes them: requests released together, one token
per step each; when the pool cannot hold the next token of every running request, park one
(the policy's, among those parked fewer than `bound` times while any is); the first parked is the
first resumed, when the pool has room for its cells plus 16 per running slot (alone: its cells and
its next token). A finished request's cells are freed. The server's prompt chunks and batch
halving are not modelled: the measured parks (report.json) are the evidence, this is the design.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolkit import workload  # noqa: E402

HEADROOM = 16


def simulate(pool: int, reqs: list[tuple[int, int]], bound: int, policy: str) -> list[int] | None:
    n = len(reqs)
    cells = [p for p, _ in reqs]
    gen, state, parks, order = [0] * n, ["run"] * n, [0] * n, []
    for _ in range(100_000):
        if all(s == "done" for s in state):
            return parks
        while order:  # the first parked first, when there is room for it
            s = order[0]
            used = sum(cells[i] for i in range(n) if state[i] == "run")
            running = 1 + sum(state[i] == "run" for i in range(n))
            if pool - used < cells[s] + (HEADROOM * running if running > 1 else 1):
                break
            order.pop(0)
            state[s] = "run"
        runs = [i for i in range(n) if state[i] == "run"]
        while runs and sum(cells[i] for i in runs) + len(runs) > pool:
            if len(runs) < 2:
                return None  # one request alone outgrows the pool
            cands = [i for i in runs if parks[i] < bound] or runs
            v = (max if policy == "largest" else min)(cands, key=lambda i: (cells[i], -i if policy == "largest" else i))
            state[v], parks[v] = "parked", parks[v] + 1
            order.append(v)
            runs.remove(v)
        for i in runs:
            cells[i] += 1
            gen[i] += 1
            if gen[i] >= reqs[i][1]:
                state[i], cells[i] = "done", 0
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload")
    ap.add_argument("--policy", choices=["largest", "smallest"], default="largest")
    ap.add_argument("--bound", type=int, default=3)
    a = ap.parse_args()
    wl = workload.load(a.workload)
    reqs = [(len(r.prompt), r.n_predict) for r in wl.requests]
    for bound, name in ((a.bound, f"bound {a.bound}"), (10**9, "no bound")):
        parks = simulate(wl.server.ctx, reqs, bound, a.policy)
        print(f"{wl.name} {a.policy}, {name}: parks per request {parks}, {sum(parks) if parks else '-'} in all")


if __name__ == "__main__":
    main()
