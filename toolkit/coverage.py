"""Shape coverage: which shapes of the failure point the runs reached (issue 26).

A PASS is only as strong as the situations the handler met. At the moment the pool runs out,
each slot in play has a phase (generating, or still in its prompt), some entries of the failing
batch not yet decoded (at and after the failure offset `off`), and a place in the batch relative
to the victim's; the samplers carry state or do not. A wrong patch that mistreats one of these
cases passes every run that never reaches it. So every run's overflows (and, for the
preemption families, its parks) are read into the shape cells below, from upstream's own
verbose log (measure.py), never from the patch; the report lists each cell with the workload
and run that reached it, or "not reached".

Pure functions; the shape vocabulary lives here, and each patch family declares in its
patch.toml (`shapes`) which cells its handler can meet (docs/DESIGN.md argues reachability).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from . import measure, overflows
from .overflows import PAIRS, PAIRS_ALL, overflow_pairs  # noqa: F401 (the coverage tables' names)
from .record import Run
from .workload import Workload

# The vocabulary: every cell a family may declare, in report order.
EVICTION = (
    "in play: 2", "in play: 3+",
    "victim: generating", "victim: in its prompt",
    "survivor: generating", "survivor: in its prompt",
    "victim undecoded: 0", "victim undecoded: 1", "victim undecoded: >1",
    "survivor undecoded: 0", "survivor undecoded: 1", "survivor undecoded: >1",
    "victim entries: before every survivor's", "victim entries: between survivors'",
    "victim entries: after every survivor's",
    "sampler: greedy", "sampler: stateful",
)
PREEMPTION = (
    "parked: generating", "parked: in its prompt",
    "parks of one request: 1", "parks of one request: >1",
    "sampler: greedy", "sampler: stateful",
)
SHAPES = EVICTION + tuple(s for s in PREEMPTION if s not in EVICTION)


@dataclass(frozen=True)
class Reached:
    shape: str
    by: str | None      # "<workload> run <k>" of the first run that reached it; None: not reached
    repeats: int = 0    # of the suite's repeats (run k of every workload), how many reached it
    of: int = 0         # the suite's repeats (--repeat)

    def where(self) -> str:
        """The first run that reached it, and in how many of the repeats (a shape reached by one
        lucky run of three is not the suite's by design)."""
        if self.by is None:
            return "NOT REACHED"
        return self.by + (f" (in {self.repeats} of {self.of} repeats)" if self.of > 1 else "")


def sampler(wl: Workload) -> str:
    """Whether a survivor's sampler carries state from token to token (seeded temperature,
    penalties): only then can a patch that resets or disturbs it change a stream."""
    return "sampler: stateful" if any(r.stateful for r in wl.requests) else "sampler: greedy"


def overflow_shapes(ev: measure.Overflow) -> set[str]:
    """The cells one measured overflow reached. The victim is the slot terminated when there is
    exactly one (the candidate's), else the policy's measured choice."""
    victim_slot = ev.terminated[0] if len(ev.terminated) == 1 else (ev.expected[0] if len(ev.expected) == 1 else None)
    if victim_slot is None or ev.at(victim_slot) is None:
        return set()
    v = ev.at(victim_slot)
    survivors = [s for s in ev.in_play if s.slot != victim_slot]
    out = {f"in play: {'2' if len(ev.in_play) == 2 else '3+'}" if len(ev.in_play) >= 2 else "in play: 1"}
    def bucket(n: int) -> str:
        return ">1" if n > 1 else str(n)
    out.add(f"victim: {'generating' if v.phase == 'generating' else 'in its prompt'}")
    nv = overflows.undecoded(ev, v)
    if nv is not None:
        out.add(f"victim undecoded: {bucket(nv)}")
    for s in survivors:
        out.add(f"survivor: {'generating' if s.phase == 'generating' else 'in its prompt'}")
        n = overflows.undecoded(ev, s)
        if n is not None:
            out.add(f"survivor undecoded: {bucket(n)}")
    if survivors:
        before = sum(s.position < v.position for s in survivors)
        out.add("victim entries: " + ("before every survivor's" if before == 0 else
                                      "after every survivor's" if before == len(survivors) else "between survivors'"))
    return out


# Pairs (issue 34): overflows.py defines them (a pair is a property of one overflow, and a workload
# may be designed to reach one: overflows.designed).


def pair_matrix(runs: list[tuple[str, Run, Workload]], policy: str = "largest",
                expect: str = "eviction") -> tuple[Reached, ...]:
    """Each reachable pair with the first run that reached it and in how many repeats (as matrix);
    then any pair argued unreachable that a run reached (the argument would be wrong). A preemption
    family's runs: its parks, each read as an overflow whose victim was parked (the families include
    the eviction's batch surgery as it is, so the index arithmetic and its pairs are the same)."""
    events = overflows.parks_read_as_overflows if expect == "preemption" else measure.overflows
    got = _tally(runs, lambda run, wl: set().union(*(overflow_pairs(ev) for ev in events(run, wl, policy))))
    unreachable = sorted(set(got[0]) - set(PAIRS))
    return _reached((*PAIRS, *unreachable), *got)


def pause_shapes(run: Run) -> set[str]:
    """The cells the parks of one run reached: the phase each parked request was in (no token
    streamed before the pause: in its prompt) and how many times one request was parked."""
    out = set()
    for ps in measure.pauses(run).values():
        for p in ps:
            out.add("parked: in its prompt" if p.at_token <= 0 else "parked: generating")
        out.add(f"parks of one request: {'1' if len(ps) == 1 else '>1'}")
    return out


def run_shapes(run: Run, wl: Workload, expect: str, policy: str = "largest") -> set[str]:
    if expect == "preemption":
        got = pause_shapes(run)
    else:
        got = set().union(*(overflow_shapes(ev) for ev in measure.overflows(run, wl, policy)))
    return got | {sampler(wl)} if got else got


def matrix(runs: list[tuple[str, Run, Workload]], declared: tuple[str, ...], expect: str,
           policy: str = "largest") -> tuple[Reached, ...]:
    """Each declared cell with the first run (by label) that reached it, in declared order, and in
    how many of the suite's repeats it was reached (label "<workload> run <k>[ (start n)]": run k
    of every workload is repeat k; an earlier start counts for its run's repeat)."""
    return _reached(declared, *_tally(runs, lambda run, wl: run_shapes(run, wl, expect, policy)))


def _tally(runs, cells_of) -> tuple[dict[str, str], dict[str, set[int]], set[int]]:
    """(first run label per cell, the repeats that reached each cell, every repeat seen)."""
    first: dict[str, str] = {}
    seen: dict[str, set[int]] = {}
    repeats: set[int] = set()
    for label, run, wl in runs:
        m = re.search(r" run (\d+)", label)
        k = int(m.group(1)) if m else 1
        repeats.add(k)
        for s in sorted(cells_of(run, wl)):
            first.setdefault(s, label)
            seen.setdefault(s, set()).add(k)
    return first, seen, repeats


def _reached(cells, first, seen, repeats) -> tuple[Reached, ...]:
    return tuple(Reached(s, first.get(s), len(seen.get(s, ())), len(repeats)) for s in cells)


def missed(cov: tuple[Reached, ...]) -> list[str]:
    return [c.shape for c in cov if c.by is None]
