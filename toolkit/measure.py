"""A run, measured once: every fact a check reads, in one frozen record.

compare.py judges a `Measured` and never measures: the same facts are derived once per run (and
per victim policy), so two checks cannot derive them differently. The measuring itself lives by
its reason:
- serverlog.py: what upstream's verbose log says (the log against the streams, samples against
  decodes, the decode steps, a terminated task decoding on or released late);
- overflows.py: every overflow of the pool (who was in play, their cells, the offset, the
  policy's victim), from the client's records or the log; the shapes a workload is designed for;
- pauses.py: every pause of a preempted request, parks that freed nothing, the parks' order.
This module's names are re-exported from those, so `measure.X` stays the measuring stage's one
door for the report, the referee and the tests.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .overflows import (Offset, Overflow, SlotAt, decoded_first, designed, designed_park, evicts,
                        first_group_offsets, offset, other_adapters_in_park, overflows, parked_past_headroom,
                        prompt_not_largest, resume_headroom, shape, shift_exercised)
from .pauses import (PARK_BOUND, Admission, Park, Pause, admissions, parks, parks_in_order, pauses, unfreed_parks,
                     unseen_parks, word)
from .record import Run
from .serverlog import EXCEEDED, log_truncated, not_stopped, sampling_problems, steps, trace_problems
from .workload import Workload

__all__ = ["Measured", "measure",
           "Offset", "Overflow", "SlotAt", "decoded_first", "designed", "evicts", "first_group_offsets", "offset",
           "designed_park", "other_adapters_in_park", "parked_past_headroom", "resume_headroom", "overflows", "prompt_not_largest", "shape", "shift_exercised",
           "PARK_BOUND", "Admission", "Park", "Pause", "admissions", "parks", "parks_in_order", "pauses", "unfreed_parks", "unseen_parks", "word",
           "EXCEEDED", "log_truncated", "not_stopped", "sampling_problems", "steps", "trace_problems"]


@dataclass(frozen=True)
class Measured:
    """One run of one workload, measured under one victim policy."""
    run: Run                                   # the record itself: outcomes, streams, events, the server's health
    wl: Workload
    policy: str
    overflows: tuple[Overflow, ...]            # every overflow, the policy's victim on its numbers
    evicts: bool                               # fewer requests terminated than were in play
    designed: tuple[tuple[str, bool, str], ...]  # the first overflow's designed shapes (largest policy); with no
                                                 # overflow, a preempting run's (overflows.designed_park)
    shape_miss: str | None                     # why the run lacks the workload's designed shape; None: it has it
    offsets: dict[int, Offset]                 # the first group's step offsets, relative to its first request
    trace_problems: tuple[str, ...]            # the log is not this run's (empty without a log)
    sampling_problems: tuple[str, ...]         # a decode that is not the slot's sample
    sampling_unjudged: tuple[int, ...]         # slots with several tokens per entry (speculative decoding)
    not_stopped: tuple[str, ...]               # a terminated task that decoded on, or was released after its step
    release_judged: bool                       # the log shows the loop's turns, so a release's step is known
    pauses: dict[int, tuple[Pause, ...]]       # slot -> its pauses
    unfreed_parks: tuple[str, ...]             # a park after which the same offset ran out again
    parks_in_order: tuple[Park, ...]           # every park, with the requests generating beside it
    earlier: tuple["Measured", ...] = ()       # every earlier start of the run, made again for its shape
    unseen_parks: int = 0                      # parks back at the next step: no pause the log can time
    log_truncated: bool = False                # the log ended early: measured from the client's records
    admissions: tuple[Admission, ...] = ()     # requests that waited while one was parked, and when they started

    @property
    def preempts(self) -> bool:
        """A request paused while others went on."""
        return any(self.pauses.values())


def measure(run: Run, wl: Workload, policy: str = "largest") -> Measured:
    """Everything the checks read, derived once. A log that ends before the run did (a prefix of
    every stream) is set aside: the run is measured from the client's records, and the checks that
    read only the log say they could not judge."""
    if run.trace and log_truncated(run):
        m = measure(replace(run, trace=()), wl, policy)
        return replace(m, log_truncated=True)
    evs = overflows(run, wl, policy)
    largest = evs if policy == "largest" else overflows(run, wl)
    sampled, unjudged = sampling_problems(run) if run.trace else ([], [])
    stopped, release_judged = not_stopped(run)
    return Measured(
        run, wl, policy, evs, evicts(run, wl), tuple(designed(largest[0], wl) if largest else designed_park(run, wl)),
        shape(run, wl), first_group_offsets(run, wl),
        tuple(trace_problems(run)) if run.trace else (), tuple(sampled), tuple(unjudged),
        tuple(stopped), release_judged, pauses(run), tuple(unfreed_parks(run)), parks_in_order(run),
        tuple(measure(e, wl, policy) for e in run.earlier), unseen_parks=unseen_parks(run),
        admissions=admissions(run))
