"""Preemption, measured: every pause of a request while others went on (park or recompute), read
from upstream's verbose log (each generating slot's batch entry per step) and timed by the client.
Pure functions.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .record import Outcome, Run


@dataclass(frozen=True)
class Pause:
    """A request that stopped decoding while others went on, and came back (or never did): read
    from upstream's verbose log (each generating slot's batch entry per step), timed by the client."""
    slot: int
    at_token: int        # index of the first token streamed after the pause (tokens before it: at_token)
    cells: int           # the cells it held when it came back (recomputed ones, for a recompute)
    steps: int           # server steps it missed (steps where another slot had an entry)
    idle_steps: int      # steps in the pause where no slot had an entry: a wait nothing excuses
    seconds: float | None  # the client's gap between the tokens around it (None: not streamed)
    resumed: bool = True
    cells_before: int = -1  # the cells it held in its last entry before the pause (its entry taken out undecoded)
    step: int = -1          # the server step it was parked in (its last entry's)
    restored: bool = False  # its sequence was read back from host memory before it resumed (upstream's
                            # "state_read_meta ... dest_seq_id" for its slot, after its park): a swap


@lru_cache(maxsize=64)
def _entries(run: Run) -> tuple[dict, list, dict]:
    """Upstream's log, per workload request: slot -> [step, cells, sampled] of each batch entry;
    per step, whether any slot had an entry; slot -> the steps its sequence was read back in."""
    first: dict[int, int] = {}
    seen: dict[int, list[list[int]]] = {}  # slot -> [step index, cells, sampled] of each entry
    busy: list[bool] = []                  # per step: did any slot have an entry
    restores: dict[int, list[int]] = {}    # slot -> the steps its sequence was read back in
    step = -1
    for t in run.trace:
        if t.kind == "restore":
            restores.setdefault(t.slot, []).append(step)
        elif t.kind == "launch":
            first.setdefault(t.slot, t.task)
        elif t.kind == "step":
            step += 1
            busy.append(False)
        elif t.kind == "entry" and first.get(t.slot) == t.task and step >= 0:
            busy[step] = True
            seen.setdefault(t.slot, []).append([step, t.value, 0])
        elif t.kind == "token" and first.get(t.slot) == t.task and seen.get(t.slot) and seen[t.slot][-1][0] == step:
            # a sample in the entry's own step: the entry was decoded (one cell more). A sample in a later
            # step, before the slot's next entry, is a resume's own (a recompute that decoded the pending
            # token with the history samples its successor there): the entry itself was taken out undecoded
            seen[t.slot][-1][2] = 1
    return seen, busy, restores


@lru_cache(maxsize=64)  # compare, unfreed_parks, the report and the referee all ask, per run
def pauses(run: Run) -> dict[int, tuple[Pause, ...]]:
    """Every pause of every workload request (slot -> pauses, in order). A slot whose entries stop
    before its request ended and never come back has one last pause with resumed=False."""
    seen, busy, restores = _entries(run)
    outs = {o.slot: o for o in run.outcomes}
    out: dict[int, tuple[Pause, ...]] = {}
    for slot, entries in seen.items():
        o = outs.get(slot)
        if o is None:
            continue
        ps = []
        for (i, cells_i, sampled), (j, cells, _) in zip(entries, entries[1:]):
            missed = sum(busy[i + 1:j])
            if missed == 0:
                continue
            # what it held when it paused: its last entry's cells, plus that entry if it was decoded
            # (parked at an offset past it); an entry taken out undecoded is made again on resume
            before = cells_i + sampled
            k = before - o.prompt_tokens + 1  # tokens streamed before the pause
            gap = o.token_t[k] - o.token_t[k - 1] if 0 < k < len(o.token_t) else None
            back = any(i < x <= j for x in restores.get(slot, ()))
            ps.append(Pause(slot, k, cells, missed, (j - i - 1) - missed, gap, cells_before=before, step=i,
                            restored=back))
        last_step, last_cells, _ = entries[-1]
        if o.outcome == "timeout":  # it stopped and nothing ended it (an error or a rejection would have)
            tail = busy[last_step + 1:]
            ps.append(Pause(slot, last_cells - o.prompt_tokens + 1, last_cells, sum(tail),
                            len(tail) - sum(tail), None, resumed=False, cells_before=last_cells, step=last_step))
        if ps:
            out[slot] = tuple(ps)
    return out


def decoded_while_parked(run: Run) -> list[tuple[Pause, tuple[int, ...]]]:
    """Each resumed pause, with the slots (workload requests) that had a batch entry between its
    park and its resume: who ran while it was out."""
    seen, _, _ = _entries(run)
    out = []
    for slot, ps in pauses(run).items():
        for p in ps:
            back = min((step for step, _, _ in seen[slot] if step > p.step), default=None)
            if p.resumed and back is not None:
                out.append((p, tuple(s for s, es in sorted(seen.items())
                                     if s != slot and any(p.step < step < back for step, _, _ in es))))
    return out


def unseen_parks(run: Run) -> int:
    """Entries taken out undecoded (no sample in their step) and made again at once, with no step
    of another slot between: a park that came back at the next step (a slot finished in the step
    it was parked in) leaves no pause to time, so `pauses` cannot count it; this is how many there
    may be."""
    seen, busy, _ = _entries(run)
    return sum(1 for entries in seen.values() for (i, _, sampled), (j, _, _) in zip(entries, entries[1:])
               if not sampled and not sum(busy[i + 1:j]))


def unfreed_parks(run: Run) -> list[str]:
    """A park must give the pool its victim's cells: after it the server retries the same offset
    with the entries left, and a second exhaustion there is explained only when those entries
    outnumber the cells freed. Read from upstream's log: per step, its entries in batch order and
    its retries ("retrying with smaller batch size, off = X, n_batch = 1" precedes each exhaustion
    at n_batch 1), and the pauses that began in that step (their cells, measured)."""
    ps = [p for v in pauses(run).values() for p in v]
    first: dict[int, int] = {}
    steps: list[tuple[list[int], list[tuple[int, int]]]] = []  # per step: entries' slots, retries (off, n_batch)
    for t in run.trace:
        if t.kind == "launch":
            first.setdefault(t.slot, t.task)
        elif t.kind == "step":
            steps.append(([], []))
        elif steps and t.kind == "entry" and first.get(t.slot) == t.task:
            steps[-1][0].append(t.slot)
        elif steps and t.kind == "retry":
            steps[-1][1].append((t.value, t.token))
    problems = []
    for k, (entries, retries) in enumerate(steps):
        parked = [p for p in ps if p.step == k]
        if not parked:
            continue
        for off in dict.fromkeys(o for o, n in retries if n == 1):
            exhausted = sum(1 for o, n in retries if o == off and n == 1)
            gone = [p for p in parked if p.slot in entries and entries.index(p.slot) >= off]
            if exhausted < 2 or not gone:
                continue
            victim = max(gone, key=lambda p: p.cells_before)
            left = sum(1 for i, s in enumerate(entries) if i >= off and s != victim.slot)
            if victim.cells_before >= left:
                problems.append(f"slot {victim.slot} was parked holding {victim.cells_before} cells, yet the retry at "
                                f"off {off} with {left} entries left ran out again: its cells did not come back")
    return problems


def word(o: Outcome, ps: tuple[Pause, ...] = ()) -> str:
    """The outcome in one word: the record's, or "resumed" for a request that completed after a pause."""
    return "resumed" if o.outcome == "completed" and any(p.resumed for p in ps) else o.outcome


def parks(run: Run) -> bool:
    """Measured: did a request pause while others went on (the candidate preempts)?"""
    return any(pauses(run).values())


# patchkit's preemption families pass over a task parked this many times while another can go (the
# fork's rule: it protects a slot after 3 parks; helper.cpp.j2, a fast test keeps the two equal).
PARK_BOUND = 3


@dataclass(frozen=True)
class Park:
    """One park, with who else could have been parked in its step."""
    slot: int
    step: int
    before: int                           # times this request had been parked before
    rivals: tuple[tuple[int, int], ...]   # (slot, its parks so far) of every other request generating in that step


def parks_in_order(run: Run) -> tuple[Park, ...]:
    """Every park in step order, each with the requests that were generating beside it (an entry in
    that step, not parked in it) and how often each had been parked: what a starvation bound is
    judged on. Read from upstream's log, the same steps `pauses` counts."""
    first: dict[int, int] = {}
    entries: list[set[int]] = []
    for t in run.trace:
        if t.kind == "launch":
            first.setdefault(t.slot, t.task)
        elif t.kind == "step":
            entries.append(set())
        elif t.kind == "entry" and first.get(t.slot) == t.task and entries:
            entries[-1].add(t.slot)
    events = sorted((p.step, p.slot) for v in pauses(run).values() for p in v if p.step >= 0)
    parked_at: dict[int, set[int]] = {}
    for step, slot in events:
        parked_at.setdefault(step, set()).add(slot)
    count: dict[int, int] = {}
    out = []
    for step, slot in events:
        rivals = tuple((s, count.get(s, 0)) for s in sorted(entries[step] if step < len(entries) else ())
                       if s != slot and s not in parked_at[step])
        out.append(Park(slot, step, count.get(slot, 0), rivals))
        count[slot] = count.get(slot, 0) + 1
    return tuple(out)


@dataclass(frozen=True)
class Admission:
    """A request that arrived while another was parked, and when it started: read from upstream's
    log (its queue's "new task" line, the slot's "processing task" line), in the loop's steps."""
    task: int
    slot: int            # the slot it started on
    arrived: int         # the step its task was handed to the queue in
    started: int         # the step it started in
    parked: int          # the slot parked when it arrived (the first such)
    park_step: int       # that slot's park
    resume_step: int     # ... and the step it came back in (-1: never)

    @property
    def first(self) -> bool:
        """It started only once the parked request was back (a launch in the park's own step is
        after the park: the loop takes new tasks between two steps)."""
        return 0 <= self.resume_step <= self.started


def admissions(run: Run) -> tuple[Admission, ...]:
    """Every request waiting while one was parked (handed to the queue before the parked one came
    back, not started before its park), with where it started. A park's window runs from its step (the loop takes new tasks after that step) to the
    step its slot's entries come back in (its resume, before that step's batch). Requests are the
    tasks a launch names; the queue's other tasks (the loop's own NEXT_RESPONSE) never start."""
    windows = []
    for v in pauses(run).values():
        for p in v:
            if p.step >= 0:
                windows.append((p.step, p.step + 1 + p.steps + p.idle_steps if p.resumed else -1, p.slot))
    return _admitted(run.trace, windows)


def queue_admissions(trace) -> tuple[Admission, ...]:
    """`admissions` for traffic, where a slot serves many tasks one after another: a park is a gap
    in one task's batch entries (the steps between two of its entries) while other tasks' entries
    went on, read per task from upstream's log. A park that never came back is not a window here
    (the conversation's own checks see the turn lost)."""
    seen: dict[int, list[int]] = {}     # task -> steps of its entries
    slot_of: dict[int, int] = {}
    busy: list[bool] = []
    step = -1
    for t in trace:
        if t.kind == "step":
            step += 1
            busy.append(False)
        elif t.kind == "entry" and step >= 0:
            busy[step] = True
            seen.setdefault(t.task, []).append(step)
            slot_of[t.task] = t.slot
    windows = [(i, j, slot_of[task]) for task, steps in seen.items() for i, j in zip(steps, steps[1:])
               if any(busy[i + 1:j])]
    return _admitted(trace, windows)


def _admitted(trace, windows: list[tuple[int, int, int]]) -> tuple[Admission, ...]:
    """The tasks handed to the queue inside a park's window (step, resume step or -1, slot) and not
    started before its park, with where each started."""
    posted: dict[int, int] = {}
    launched: dict[int, tuple[int, int]] = {}   # task -> (slot, step)
    step = -1
    for t in trace:
        if t.kind == "step":
            step += 1
        elif t.kind == "post":
            posted.setdefault(t.task, step)
        elif t.kind == "launch":
            launched.setdefault(t.task, (t.slot, step))
    out = []
    for task, arrived in posted.items():
        if task not in launched:
            continue
        slot, started = launched[task]
        for i, j, parked in sorted(windows):
            if parked != slot and started >= i and (j < 0 or arrived < j):
                # in the queue while `parked` was parked: not started before its park, handed over
                # before it came back (a task handed over in the resume's own step may follow it)
                out.append(Admission(task, slot, arrived, started, parked, i, j))
                break
    return tuple(out)
