"""Parks per request of a workload under the park families' rules, simulated (no server): how
many-resumes-8 was sized before it was measured. Prints figures; asserts nothing.

    python bench/park_schedule.py many-resumes-8 [--policy largest|smallest] [--bound 3] [--jitter 8]

The rules, as patches/park-slot/helper.cpp.j2 writes them: requests released together, one token
per step each; when the pool cannot hold the next token of every running request, park one
(the policy's, among those parked fewer than `bound` times while any is); the first parked is the
first resumed, when the pool has room for its cells plus 16 per running slot (alone: its cells and
its next token). A finished request's cells are freed. The server's prompt chunks and batch
halving are not modelled: the measured parks (report.json) are the evidence, this is the design.
`--jitter N`: 300 runs more, each request starting to generate 0..N steps late (seeded), as the
server's launch order and prompt steps shift a real run: a design that holds only aligned is luck.
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolkit import workload  # noqa: E402

HEADROOM = 16


def simulate(pool: int, reqs: list[tuple[int, int]], bound: int, policy: str,
             late: list[int] | None = None) -> tuple[list[int], int] | None:
    """(parks per request, parks that starve: a request parked a 4th time or more while one parked
    fewer than 3 times generated beside it), or None when one request alone outgrows the pool.
    `late`: steps each request starts generating after the others (0: together)."""
    n = len(reqs)
    cells = [p for p, _ in reqs]
    gen, state, parks, order = [0] * n, ["run"] * n, [0] * n, []
    wait, starving = list(late or [0] * n), 0
    for _ in range(100_000):
        if all(s == "done" for s in state):
            return parks, starving
        while order:  # the first parked first, when there is room for it
            s = order[0]
            used = sum(cells[i] for i in range(n) if state[i] == "run")
            running = 1 + sum(state[i] == "run" for i in range(n))
            if pool - used < cells[s] + (HEADROOM * running if running > 1 else 1):
                break
            order.pop(0)
            state[s] = "run"
        runs = [i for i in range(n) if state[i] == "run"]
        while runs and sum(cells[i] for i in runs) + sum(wait[i] <= 0 for i in runs) > pool:
            if len(runs) < 2:
                return None  # one request alone outgrows the pool
            cands = [i for i in runs if parks[i] < bound] or runs
            v = (max if policy == "largest" else min)(cands, key=lambda i: (cells[i], -i if policy == "largest" else i))
            starving += parks[v] >= 3 and any(parks[i] < 3 for i in runs if i != v)
            state[v], parks[v] = "parked", parks[v] + 1
            order.append(v)
            runs.remove(v)
        for i in runs:
            if wait[i] > 0:
                wait[i] -= 1
                continue
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
    ap.add_argument("--jitter", type=int, default=0, help="also 300 runs with starts up to N steps apart")
    a = ap.parse_args()
    wl = workload.load(a.workload)
    reqs = [(len(r.prompt), r.n_predict) for r in wl.requests]
    for bound, name in ((a.bound, f"bound {a.bound}"), (10**9, "no bound")):
        got = simulate(wl.server.ctx, reqs, bound, a.policy)
        parks, starving = got if got else (None, 0)
        print(f"{wl.name} {a.policy}, {name}: parks per request {parks}, {sum(parks) if parks else '-'} in all, "
              f"{starving} starving park(s)")
        if a.jitter:
            rnd = random.Random(26)
            runs = [simulate(wl.server.ctx, reqs, bound, a.policy, [rnd.randint(0, a.jitter) for _ in reqs])
                    for _ in range(300)]
            ok = [r for r in runs if r]
            most = [max(p) for p, _ in ok]
            st = [x for _, x in ok]
            print(f"  starts up to {a.jitter} steps apart, 300 runs: {len(runs) - len(ok)} outgrew the pool; most "
                  f"parks of one request {min(most, default=0)}-{max(most, default=0)}; starving parks "
                  f"{min(st, default=0)}-{max(st, default=0)} (runs with none: {sum(x == 0 for x in st)})")


if __name__ == "__main__":
    main()
