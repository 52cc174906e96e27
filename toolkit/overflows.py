"""Overflows of the pool, measured from the client's own records (or upstream's log): no patch testimony.

The client knows each request's prompt length and every token streamed to it, with its
arrival time; /slots snapshots (taken by the server between two decode steps) add exact
step alignment when one landed while the requests were generating. From these, for every
overflow event (a request that got "Context size has been exceeded."):

- which requests were in play (generating, not yet finished, not terminated earlier);
- how many tokens each had sampled at the failing step: the terminated request's own count
  is exact (its stream stops there); a survivor's is the terminated one's plus their step
  offset (from a /slots snapshot: exact; else from arrival times: the median, with its
  spread as the uncertainty);
- the cells each held: prompt + sampled - 1 (the last sampled token is the batch entry not
  yet decoded), +1 for entries decoded in this step before the failure offset;
- the free cells when the step began = the offset where it failed: the batch halves down
  to single entries and decodes until no cell is left, so `off == free` (< entries: full);
- each one's position in the failing batch (generating slots, in slot order);
- the policy's victim on these numbers, and its margin over the runner-up.

Pure functions; measure.py gathers them into one record per run, runner.py uses `shape()` to
re-make a start that did not have the workload's designed shape.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .pauses import decoded_while_parked, parks, pauses
from .record import Outcome, Run, Sample
from .serverlog import EXCEEDED, kv_errors, kv_outcome, steps
from .workload import PARK_SHAPE, PAST_HEADROOM, Workload


@dataclass(frozen=True)
class Offset:
    steps: int     # b's sampled count minus a's at the same server step
    spread: int    # uncertainty (0: exact)
    source: str    # "/slots snapshot" | "arrival times" | "none"


@dataclass(frozen=True)
class SlotAt:
    slot: int
    prompt: int
    generated: int     # tokens sampled when the pool ran out
    cells: int         # cells held when the server chose (see module doc)
    position: int      # its entry's index in the failing batch
    spread: int        # uncertainty of generated/cells (0: exact)
    source: str        # "own stream" or the Offset's source
    phase: str = "generating"  # or "prompt": in play without an entry of its own (a prompt chunk)


@dataclass(frozen=True)
class Overflow:
    t: float                      # when the terminated request's error arrived
    terminated: tuple[int, ...]   # slots that got the error in this step
    in_play: tuple[SlotAt, ...]
    pool: int
    free: int                     # free cells when the step began == the failure offset
    entries: int                  # entries in the failing batch
    expected: tuple[int, ...]     # the policy's choice on these numbers
    margin: int                   # cells between the choice and the runner-up
    uncertainty: int              # summed spreads of the slots compared
    leaked: int = 0               # cells taken by no slot in play (the pool's accounting does not add up)

    @property
    def full(self) -> bool:
        """The pool was full when the step failed, and every taken cell is a slot in play's."""
        return 0 <= self.free < self.entries and not self.leaked

    @property
    def off(self) -> int:
        return self.free

    def at(self, slot: int) -> SlotAt | None:
        return next((s for s in self.in_play if s.slot == slot), None)

    def describe(self) -> str:
        cells = ", ".join(f"{s.slot}:{s.cells}" + (f"±{s.spread}" if s.spread else "") for s in self.in_play)
        return (f"t={self.t:.3f} s: terminated {list(self.terminated)}; in play (slot:cells) {cells}; "
                f"pool {self.pool}, free {self.free} for {self.entries} entries -> off {self.off}"
                + (f"; {self.leaked} cell(s) taken by no slot in play (pool {self.pool} less the cells in play "
                   f"leaves {self.free + self.leaked} free, the step failed at off {self.off})" if self.leaked else ""))


def _snapshots(samples: tuple[Sample, ...]) -> list[dict[int, Sample]]:
    by_t: dict[float, dict[int, Sample]] = {}
    for s in samples:
        by_t.setdefault(s.t, {})[s.slot] = s
    return [by_t[t] for t in sorted(by_t)]


def _generating(s: Sample | None, n_predict: int) -> bool:
    return s is not None and s.processing and 1 <= s.generated < n_predict


def offset(a: Outcome, b: Outcome, samples: tuple[Sample, ...]) -> Offset:
    """How many more tokens b had sampled than a at any one step while both were generating."""
    seen = [snap[b.slot].generated - snap[a.slot].generated for snap in _snapshots(samples)
            if _generating(snap.get(a.slot), a.n_predict) and _generating(snap.get(b.slot), b.n_predict)]
    if seen:
        return Offset(max(set(seen), key=seen.count), 0, "/slots snapshot")
    return _align(a.token_t, b.token_t)


def _align(ta: tuple[float, ...], tb: tuple[float, ...]) -> Offset:
    """Step offset from arrival times alone. A token can arrive late (its HTTP thread was not
    scheduled; it then comes in a burst with the ones queued behind it), never early, and both
    streams get a token every step. At the true offset d, every pair (a's k-th, b's (k+d)-th)
    left the server in the same step, so each pair where neither was late arrives together
    (within a fraction of a step); at any other offset only coincidences do. So d is the offset
    with the most coinciding pairs; offsets with at least half as many count as uncertainty."""
    if len(ta) < 3 or len(tb) < 3:
        return Offset(0, 0, "none")
    step = _median([y - x for x, y in zip(ta, ta[1:])] + [y - x for x, y in zip(tb, tb[1:])]) or 1e-6
    tol = step / 3
    a, b = np.asarray(ta), np.asarray(tb)
    hits: dict[int, int] = {}
    for d in range(-len(a) + 1, len(b)):
        lo, hi = max(0, -d), min(len(a), len(b) - d)
        n = int(np.count_nonzero(np.abs(a[lo:hi] - b[lo + d:hi + d]) < tol))
        if n:
            hits[d] = n
    if not hits:
        return Offset(0, 0, "none")
    best = max(hits, key=lambda d: (hits[d], -abs(d)))
    near = [d for d, n in hits.items() if 2 * n >= hits[best]]
    return Offset(best, max(abs(d - best) for d in near), "arrival times")


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else 0.0


def _choose(slots: list[SlotAt], policy: str, wl: Workload,
            tasks: dict[int, int] | None = None, shared: tuple[int, int] = (0, 0)) -> tuple[tuple[int, ...], int, int]:
    """(the policy's victims, margin over the runner-up, uncertainty). `newest`: the slot whose
    task the server created last (its id, from upstream's launch lines): requests released
    together still reach the server one after another, so there is always one newest, and
    the server's own numbering says which. Without the log, the workload's start times decide
    (released together: all tied, ambiguous)."""
    if not slots:
        return (), 0, 0
    if policy == "newest":
        if tasks and all(s.slot in tasks for s in slots):
            newest = max(slots, key=lambda s: tasks[s.slot])
            return (newest.slot,), 1, 0
        starts = {r.slot: r.start_ms for r in wl.requests}
        last = max(starts.get(s.slot, 0) for s in slots)
        return tuple(s.slot for s in slots if starts.get(s.slot, 0) == last), 0, 0
    sign = 1 if policy == "largest" else -1
    ranked = sorted(slots, key=lambda s: sign * s.cells, reverse=True)
    best = ranked[0]
    # the policy's own equivalence: every slot that can be the policy's choice within the
    # measurement's doubt is a right victim (four equal requests: any of the four). Each slot holds
    # cells - spread .. cells + spread; the choice holds at least the most any slot surely holds
    # (largest; mirrored for smallest), and of k slots in their prompt measured together
    # (`shared`: the cells they hold between them, and k) one holds at least a k-th of it, at most a
    # k-th for the smallest
    held, k = shared
    if sign > 0:
        bar = max([s.cells - s.spread for s in slots] + ([-(-held // k)] if k else []))
        tied = tuple(s.slot for s in ranked if s.cells + s.spread >= bar)
    else:
        bar = min([s.cells + s.spread for s in slots] + ([held // k] if k else []))
        tied = tuple(s.slot for s in ranked if s.cells - s.spread <= bar)
    runner = next((s for s in ranked if s.slot not in tied), None)
    if runner is None:
        return tied, 0, max(s.spread for s in ranked)
    return tied, abs(best.cells - runner.cells), best.spread + runner.spread


def _batch(gen: dict[int, tuple[int, int, str]], terminated: set[int], outs: dict[int, Outcome],
           pool: int) -> tuple[list[SlotAt], int, int]:
    """The failing step's batch from everyone's sampled count: (slots in play, free cells, entries)."""
    # in play: generating (sampled >= 1, not finished), or its prompt in this very batch (0)
    play = sorted(s for s, (g, _, _) in gen.items() if s in terminated or 0 <= g < outs[s].n_predict)
    pre = {s: outs[s].prompt_tokens + gen[s][0] - 1 if gen[s][0] >= 1 else 0 for s in play}
    # the batch: one generation entry per generating slot in slot order, then prompt chunks
    order = [(s, 1) for s in play if gen[s][0] >= 1] + [(s, outs[s].prompt_tokens) for s in play
                                                          if gen[s][0] == 0]
    free = pool - sum(pre.values())
    first, decoded, k = {}, {}, 0
    for s, n in order:
        first[s] = k
        decoded[s] = max(0, min(n, free - k))  # entries below off == free were decoded
        k += n
    return ([SlotAt(s, outs[s].prompt_tokens, gen[s][0], pre[s] + decoded[s], first[s], gen[s][1], gen[s][2])
             for s in play], free, k)


def _counts(v: Outcome, n_v: int, how: str, rel: dict[int, Offset]) -> dict[int, tuple[int, int, str]]:
    """Everyone's sampled count when the failing step began: the victim's, and the others' by offset."""
    return {v.slot: (n_v, 0, how)} | {s: (n_v + d.steps, d.spread, d.source) for s, d in rel.items()}


def _infer(v: Outcome, rel: dict[int, Offset], outs: dict[int, Outcome], pool: int) -> int:
    """A non-streamed victim's sampled count: no stream tells it, so take the first step at which
    the pool, with everyone's measured offsets, is full. (Its fullness is then not a finding.)"""
    for n in range(1, v.n_predict + 1):
        _, free, entries = _batch(_counts(v, n, "", rel), {v.slot}, outs, pool)
        if free < entries:
            return n
    return 0


def _evictions(run: Run) -> list[tuple[int, int, list[int], float]]:
    """Where each eviction's handler ran, from upstream's log: (trace index of its first error, the
    index past that group of errors, the slots they went to, when the first one's error arrived)."""
    outs = {o.slot: o for o in run.outcomes}
    tr = run.trace
    slot_of = {t.task: t.slot for t in tr if t.kind == "launch"}
    kv = kv_errors(tr)
    out = []
    i = 0
    while i < len(tr):
        t = tr[i]
        if not (i in kv and slot_of.get(t.task) in outs):
            i += 1
            continue
        group, j = [], i
        # errors sent in one go: one step (a request handed to the queue meanwhile, by the HTTP
        # thread, does not split it)
        while j < len(tr) and tr[j].kind in ("error", "release", "post"):
            if j in kv and slot_of.get(tr[j].task) in outs:
                group.append(slot_of[tr[j].task])
            j += 1
        out.append((i, j, group, outs[group[0]].t_end if group else 0.0))
        i = j
    return out


def _parks(run: Run) -> list[tuple[int, int, list[int], float]]:
    """Where each park's handler ran, as _evictions has it, read from upstream's log and the pauses
    (no patch testimony): the step a parked request's last entry was in, and in it upstream's last
    try (a batch of 1 failed after its retry with n_batch = 1), after which the patch's handler runs.
    A step with two parks, or with two such failures, is left out: which failure parked which
    request is not in upstream's log."""
    tr = run.trace
    at = [k for k, t in enumerate(tr) if t.kind == "step"]
    by_step: dict[int, list[tuple[int, float]]] = {}
    outs = {o.slot: o for o in run.outcomes}
    for slot, ps in pauses(run).items():
        o = outs[slot]
        for p in ps:
            t = o.token_t[p.at_token - 1] if 0 < p.at_token <= len(o.token_t) else 0.0
            by_step.setdefault(p.step, []).append((slot, t))
    out = []
    for step, parked in sorted(by_step.items()):
        if len(parked) != 1 or not 0 <= step < len(at):
            continue
        end = at[step + 1] if step + 1 < len(at) else len(tr)
        # (index, offset) of each batch of 1 that failed after a retry with n_batch = 1 at `offset`
        tries, last_try = [], None
        for k in range(at[step], end):
            if tr[k].kind == "retry":
                last_try = (tr[k].token, tr[k].value)
            elif tr[k].kind == "batch" and tr[k].value == 1 and last_try and last_try[0] == 1:
                tries.append((k, last_try[1]))
        # the failure was that try's only if the next retry (if any) names the same offset: a try at
        # n_batch 1 that succeeded moves on to the next entry, which may fail as a batch of 1 too (D,
        # measured: off 2 decoded at n_batch 1, then off 3 failed at the full n_batch, "off = 3")
        calls = [k + 1 for k, off in tries
                 if next((x.value for x in tr[k + 1:end] if x.kind == "retry"), off) == off]
        if len(calls) == 1:
            out.append((calls[0], calls[0], [parked[0][0]], parked[0][1]))
    return out


def _children(step: list, wl: Workload, outs: dict) -> dict[int, int]:
    """An n_cmpl family's children in this step's batch: slot -> the cells it holds of its own.
    A child is no request of the workload's (the family is one, on its parent's slot) and its entry
    counts the prompt it shares with its parent, but only what it generated takes cells of its own.
    Left out, a family generating at the failure looked like cells taken by no slot in play, and
    one-victim-per-overflow FAILED a right eviction (measured on C2: a family of prompt 800 beside
    a plain request, 40 cells "leaked", the child's), and its entry was not counted in the batch
    positions. One family per workload: workload.parse refuses several (a child's family is not
    told apart)."""
    parents = [r.slot for r in wl.requests if r.n_cmpl > 1 and r.slot in outs]
    if len(parents) != 1:
        return {}
    shared = outs[parents[0]].prompt_tokens
    return {x.slot: max(0, x.value - shared) for x in step if x.kind == "entry" and x.slot not in outs}


def _chunked(chunks: list, outs: dict[int, Outcome], first: int, off: int, n_batch: int) -> list[SlotAt]:
    """The slots in their prompt at a failing step, each from its chunk line (upstream's "cached
    n_tokens = N, memory_seq_rm [p0, end)": the p0 cells it held as its chunk joined the batch).
    The chunks follow the generating slots' entries in the batch, in the lines' order, each as long
    as its prompt's rest or the batch's room; its entries below `off` were decoded in this step."""
    out = []
    for x in chunks:
        size = max(0, min(outs[x.slot].prompt_tokens - x.value, n_batch - first))
        out.append(SlotAt(x.slot, outs[x.slot].prompt_tokens, 0, x.value + max(0, min(size, off - first)), first, 0,
                          "server log (its prompt chunk)", "prompt"))
        first += size
    return out


def _shared(prompting: list[int], together: int, outs: dict[int, Outcome], position: int) -> list[SlotAt]:
    """The slots in their prompt at a failing step where a chunk line does not name each one's cells
    (_chunked), holding `together` cells between them by the pool's accounting: one such slot holds
    exactly `together`; of several, each holds at most its prompt and at least what the others'
    prompts leave: a range, given as its middle with half its width as the spread. Before, a second slot in its prompt was left out and the
    cells both held read as leaked: a right eviction FAILED (CI, prompt-survivor-full: slots 0 and
    1 in their prompts of 600 and 500 with 576 and 448 cells, "1024 cell(s) taken by no slot in
    play"). Now: slot 0 in [524, 600], slot 1 in [424, 500], so slot 0 held the most, measured.
    Where the ranges overlap, each is a right victim (a tie within the measurement's doubt)."""
    room = {s: outs[s].prompt_tokens for s in prompting}
    held = min(together, sum(room.values()))
    out = []
    for s in prompting:
        lo, hi = max(0, held - (sum(room.values()) - room[s])), min(room[s], held)
        out.append(SlotAt(s, room[s], 0, (lo + hi + 1) // 2, position, (hi - lo + 1) // 2,
                          "server log (pool accounting" + (", shared)" if len(prompting) > 1 else ")"), "prompt"))
    return out


def _from_trace(run: Run, wl: Workload, policy: str, parked: bool = False) -> tuple[Overflow, ...]:
    """The overflow events from upstream's own verbose log: per step it names each generating
    slot's batch entry, in batch order, with the cells that slot held ("slot decode token ...
    n_tokens"), and it names the task each error went to. Exact, and independent of when the
    client got to read its sockets (on a loaded machine whole streams arrive in one burst).
    `parked`: the parks of a preemption run instead (_parks), each read as an overflow whose
    victim was parked: the same batch surgery, so the same arithmetic (coverage's pairs)."""
    outs = {o.slot: o for o in run.outcomes}
    tr = run.trace
    events: list[Overflow] = []
    # slots an earlier overflow terminated, and (per step) the batch positions its surgery removed:
    # a second overflow in the SAME step (the retry after the first eviction ran out again) sees the
    # batch without them, later entries shifted down. A parked slot comes back: gone for its step only.
    gone: set[int] = set()
    removed: dict[int, list[int]] = {}
    chunk_cut: dict[int, int] = {}   # per step: prompt-chunk entries an earlier surgery took out
    # per index: the last step marker at or before it (one pass: finding it per error by scanning
    # back was quadratic in a long log)
    last_step = []
    ls = -1
    for x in tr:
        ls = len(last_step) if x.kind == "step" else ls
        last_step.append(ls)
    prev_step = None
    for i, j, group, err_at in (_parks(run) if parked else _evictions(run)):
        # the step the failing batch was built in: the last marker before the error (not the last
        # marker before the last entry: a step of prompt chunks alone has no entry line, and it
        # was then read as the step before it)
        step = last_step[i - 1] if i > 0 else -1
        if parked and step != prev_step:
            gone = set()
        prev_step = step
        children = _children(tr[step:i], wl, outs) if step >= 0 else {}
        every = [x for x in tr[step:i] if x.kind == "entry" and (x.slot in outs or x.slot in children)] \
            if step >= 0 else []
        size = next((x.value for x in tr[step:i] if x.kind == "batch"), len(every)) if step >= 0 else 0
        cut = removed.get(step, [])
        entries = [x for x in every if x.slot in outs and x.slot not in gone]
        size -= len(cut) + chunk_cut.get(step, 0)
        retries = [x for x in tr[step:i] if x.kind == "retry"] if step >= 0 else []
        cells = {x.slot: x.value for x in entries}
        free = run.pool - sum(cells.values()) - sum(children.values())
        off = retries[-1].value if retries else 0  # the last retry names the offset that then failed
        # the offset must equal the pool less the cells in play. More free by the cells than the
        # offset says: cells taken by no slot in play (a leak: e.g. a terminated slot's entry decoded
        # after all); fewer: the picture is incomplete (e.g. a prompt in the batch). `full` says no.
        leaked = max(0, free - off)
        if free > off:
            free = off
        pos = {id(x): k - sum(p < k for p in cut) for k, x in enumerate(every)}
        slots = [SlotAt(x.slot, outs[x.slot].prompt_tokens, x.value - outs[x.slot].prompt_tokens + 1,
                        x.value + (1 if pos[id(x)] < off else 0), pos[id(x)], 0, "server log") for x in entries]
        tasks = {}
        for x in tr:
            if x.kind == "launch" and x.slot in outs:
                tasks.setdefault(x.slot, x.task)  # each slot's workload task (a later probe is not)
        # in play without an entry of its own: in its prompt (upstream logs no line per prompt
        # chunk). Launched before the step, not released before it.
        ended = {x.slot for x in tr[:step] if x.kind == "release"} if step >= 0 else set()
        launched = {x.slot for x in tr[:max(step, 0)] if x.kind == "launch" and tasks.get(x.slot) == x.task}
        prompting = sorted((set(group) | (launched - ended)) - set(cells) - gone)
        shared = (0, 0)
        chunks = [x for x in tr[step:i] if x.kind == "chunk" and x.slot in prompting] if step >= 0 else []
        if prompting and {x.slot for x in chunks} == set(prompting) and len(chunks) == len(prompting) \
                and sum(x.value for x in chunks) <= leaked:
            # Each one's chunk line names the cells it held as its chunk joined the batch: exact.
            # What the generating slots and these do not hold is no slot's (a leak).
            slots += _chunked(chunks, outs, len(every) - len(cut), off, wl.server.batch or 2048)
            leaked -= sum(x.value for x in chunks)
        elif prompting and step >= 0:
            # A slot in its prompt without a chunk line in this step (a layout or a batch that names
            # none): the pool's accounting measures them together. The step failed when not one
            # more cell was free, so every cell is a slot's: the prompt slots held what the
            # generating slots did not when the step began (`leaked` above), plus their entries
            # decoded below `off` in this step (prompt chunks follow the generating slots' entries
            # in the batch; a terminated slot's decoded entry below an earlier offset stays).
            together = leaked + max(0, off - len(entries))
            slots += _shared(prompting, together, outs, len(every) - len(cut))
            # cells beyond every prompt's room are no slot's: a leak, as above
            room = sum(outs[s_].prompt_tokens for s_ in prompting)
            leaked = max(0, together - room)
            shared = (min(together, room), len(prompting)) if len(prompting) > 1 else (0, 0)
        expected, margin, unc = _choose(slots, policy, wl, tasks, shared)
        events.append(Overflow(err_at, tuple(sorted(group)), tuple(slots), run.pool, free, max(size, len(slots)),
                               expected, margin, unc, leaked))
        # what this overflow's surgery took out of the step's batch: the terminated slots' entries
        # at or after the offset (below it they were decoded and stay)
        for k, x in enumerate(every):
            if x.slot in group and x.slot not in gone and k - sum(p < k for p in cut) >= off:
                removed.setdefault(step, []).append(k)
        for sl in slots:
            if sl.slot in group and sl.phase == "prompt":
                chunk_cut[step] = chunk_cut.get(step, 0) + max(0, max(size, len(slots)) - max(off, sl.position))
        gone |= set(group)
    return tuple(events)


@lru_cache(maxsize=64)
def parks_read_as_overflows(run: Run, wl: Workload, policy: str = "largest") -> tuple[Overflow, ...]:
    """Every park of a preemption run that upstream's log places exactly (_parks), as an overflow
    whose `terminated` is the parked slot: what the pairs of a preemption family are read from."""
    return _from_trace(run, wl, policy, parked=True) if any(t.kind == "entry" for t in run.trace) else ()


@lru_cache(maxsize=64)
def overflows(run: Run, wl: Workload, policy: str = "largest") -> tuple[Overflow, ...]:
    """Every overflow event of the run, measured: from upstream's verbose log when the server
    printed one (exact), else from the client's own records (see the module doc)."""
    if any(t.kind == "entry" for t in run.trace):
        return _from_trace(run, wl, policy)
    outs = {o.slot: o for o in run.outcomes}
    hit = sorted((o for o in run.outcomes if kv_outcome(o)), key=lambda o: (o.t_end, o.slot))
    events: list[Overflow] = []
    gone: set[int] = set()
    i = 0
    while i < len(hit):
        v = hit[i]
        rel: dict[int, Offset] = {}
        for o in run.outcomes:
            if o.slot != v.slot and o.slot not in gone:
                d = offset(v, o, run.samples)
                if d.source != "none":
                    rel[o.slot] = d
        if v.token_t or v.tokens:
            how = "own stream"
            # the server samples right after each sub-batch it decodes: a request whose entry sat
            # below the failure offset had been sent its next token before the pool ran out, so
            # its stream is one longer than its count when the step began. Take the count that is
            # consistent with the offset it implies.
            for n_v in (len(v.tokens), len(v.tokens) - 1):
                slots, free, entries = _batch(_counts(v, n_v, how, rel), {v.slot}, outs, run.pool)
                below = next(x.position for x in slots if x.slot == v.slot) < free
                if 0 <= free < entries and below == (n_v < len(v.tokens)):
                    break
            else:
                n_v = len(v.tokens)
        else:
            how = "non-streamed: the step where the measured pool is full"
            n_v = _infer(v, rel, outs, run.pool)
        gen = _counts(v, n_v, how, rel)
        # requests terminated in the same step: they got the error having sampled what we predict
        # (one more when their entry was decoded before the failure)
        same = [o for o in hit[i:] if o is v or (o.slot in gen and (o.token_t or o.tokens) and gen[o.slot][0]
                - gen[o.slot][1] <= len(o.tokens) <= gen[o.slot][0] + gen[o.slot][1] + 1)]
        terminated = {o.slot for o in same}
        slots, free, entries = _batch(gen, terminated, outs, run.pool)
        expected, margin, unc = _choose(slots, policy, wl)
        events.append(Overflow(v.t_end, tuple(sorted(terminated)), tuple(slots), run.pool, free, entries,
                               expected, margin, unc))
        gone |= terminated
        i += len(same)
        hit = hit[:i] + [o for o in hit[i:] if o.slot not in terminated]
    return tuple(events)


@lru_cache(maxsize=64)
def first_group_offsets(run: Run, wl: Workload) -> dict[int, Offset]:
    """Measured step offset of each request released with the first one, relative to it."""
    group = [r.slot for r in wl.first_group()]
    outs = {o.slot: o for o in run.outcomes}
    ref = outs[group[0]]
    together = next((st for st in steps(run) if all(s in st for s in group if s in outs)), None)
    if together is not None:  # one step where all of them generate: sampled counts side by side
        base = together[ref.slot] - ref.prompt_tokens
        return {s: Offset(together[s] - outs[s].prompt_tokens - base, 0, "server log") for s in group[1:] if s in outs}
    return {s: offset(ref, outs[s], run.samples) for s in group[1:] if s in outs}


def evicts(run: Run, wl: Workload) -> bool:
    """Measured: did the server end an overflow by terminating fewer requests than were in play
    (an eviction), rather than all of them (the bug)?"""
    return any(len(ev.terminated) < len(ev.in_play) for ev in overflows(run, wl))


def shift_exercised(ev: Overflow) -> tuple[bool, str]:
    """Did this overflow demand a shift? The POLICY's victim (measured, not the one the candidate
    chose: judging the shape by the candidate's choice would retry until a wrong-victim variant
    happens to pick right) must have an entry not decoded yet and a survivor's entry after it."""
    if len(ev.expected) != 1:
        return False, f"the policy's victim is not unique: {list(ev.expected)}"
    v = ev.at(ev.expected[0])
    after = [s.slot for s in ev.in_play if s.position > v.position]
    # measured (C2, victim-middle): with the failure at off 1 a missing remap once went unseen by the
    # integrity oracle although the victim's entry sat at 1; every run failing at off 0 showed it
    ok = ev.off == 0 and v.position >= ev.off and bool(after)
    return ok, (f"policy's victim slot {v.slot} at batch position {v.position}, failure at off {ev.off}: "
                + (f"survivors {after} had to shift down" if ok else
                   "its entry was already decoded, nothing shifts" if v.position < ev.off
                   else "the designed failure is at off 0" if ev.off
                   else "no survivor entry after it, nothing shifts"))


def decoded_first(ev: Overflow) -> tuple[bool, str]:
    """Was the policy's victim's entry already decoded when the pool ran out (off > its position)?
    Then nothing of it is left to remove and nothing may move: a patch that removes from the
    whole batch, or shifts regardless of off, shows here and nowhere else."""
    if len(ev.expected) != 1:
        return False, f"the policy's victim is not unique: {list(ev.expected)}"
    v = ev.at(ev.expected[0])
    ok = ev.full and v.position < ev.off
    return ok, (f"policy's victim slot {v.slot} at batch position {v.position}, failure at off {ev.off}: "
                + ("its entry was decoded before the pool ran out" if ok else "its entry was not decoded yet"))


def prompt_not_largest(ev: Overflow) -> tuple[bool, str]:
    """Is the slot holding the most cells other than the one with the longest prompt (by a margin
    the measurement resolves)? Only then does a victim chosen by prompt length show."""
    if len(ev.expected) != 1 or not ev.in_play:
        return False, f"the policy's victim is not unique: {list(ev.expected)}"
    v = ev.at(ev.expected[0])
    longest = max(ev.in_play, key=lambda s: (s.prompt, -s.slot))
    ok = longest.slot != v.slot and ev.margin > ev.uncertainty
    return ok, (f"most cells: slot {v.slot} ({v.cells} cells, prompt {v.prompt}); longest prompt: slot "
                f"{longest.slot} ({longest.cells} cells, prompt {longest.prompt})"
                + ("" if ok else ": the same slot, a victim chosen by prompt length cannot show"))


def straddled(ev: Overflow) -> tuple[bool, str]:
    """Was the policy's victim's entry undecoded while one survivor's entry before it was decoded
    and another's before it was not (0 < off < its position)? Both pairs of an undecoded victim
    with a survivor before it, in one overflow (coverage.PAIRS)."""
    if len(ev.expected) != 1 or ev.at(ev.expected[0]) is None:
        return False, f"the policy's victim is not unique: {list(ev.expected)}"
    v = ev.at(ev.expected[0])
    before = [s for s in ev.in_play if s.position < v.position and s.phase == "generating"]
    ok = (ev.full and v.position >= ev.off and any(s.position < ev.off for s in before)
          and any(s.position >= ev.off for s in before))
    return ok, (f"policy's victim slot {v.slot} at batch position {v.position}, failure at off {ev.off}, survivors "
                f"before it at {sorted(s.position for s in before)}: "
                + ("one decoded and one not" if ok else "not one decoded and one not"))


# Pairs (issue 34): the index arithmetic depends on combinations, not on each dimension alone: how
# many entries the victim had undecoded (what the surgery removes), together with where a
# survivor's entry sits relative to the victim's (after: its index shifts by them) and whether
# that entry was decoded yet. "victim undecoded V x survivor before|after, undecoded S".
PAIRS_ALL = tuple(f"victim undecoded {v} x survivor {where}, undecoded {s}"
                  for v in ("0", "1", ">1") for where in ("before", "after") for s in ("0", "1", ">1"))
# The pairs the server's batch can hold and the log can tell apart. llama.cpp's server puts every
# generating slot's one entry first, then prompt chunks; a slot's entries are contiguous and the
# failing batch's entries from `off` on are not decoded. So: a survivor before a victim that had
# none undecoded was decoded too; a survivor after a victim with undecoded entries is undecoded
# too; more than one undecoded entry is a prompt chunk, at the batch's end, and two prompts in one
# batch are not told apart (overflow_shapes). 10 of the 18 remain (docs/DESIGN.md, section 11b).
PAIRS = tuple(p for p in PAIRS_ALL if p in {
    "victim undecoded 0 x survivor before, undecoded 0", "victim undecoded 0 x survivor after, undecoded 0",
    "victim undecoded 0 x survivor after, undecoded 1", "victim undecoded 0 x survivor after, undecoded >1",
    "victim undecoded 1 x survivor before, undecoded 0", "victim undecoded 1 x survivor before, undecoded 1",
    "victim undecoded 1 x survivor after, undecoded 1", "victim undecoded 1 x survivor after, undecoded >1",
    "victim undecoded >1 x survivor before, undecoded 0", "victim undecoded >1 x survivor before, undecoded 1"})


def undecoded(ev: Overflow, s: SlotAt) -> int | None:
    """How many of `s`'s entries in the failing batch were not decoded (from `off` on): a generating
    slot's one entry, or the rest of a prompt chunk at the batch's end. None for a prompt beside
    another prompt: their chunks are not told apart here (coverage and pairs leave them out)."""
    if s.phase == "generating":
        return 1 if s.position >= ev.off else 0
    if sum(p.phase == "prompt" for p in ev.in_play) != 1:
        return None
    return max(0, ev.entries - max(ev.off, s.position))


def overflow_pairs(ev: Overflow, policy_victim: bool = False) -> set[str]:
    """The pairs one measured overflow reached (the victim as in overflow_shapes: the one
    terminated). `policy_victim`: the policy's victim instead, as a designed shape is read (a candidate
    that evicts the wrong slot must be judged on the designed start, not have it re-made)."""
    victim_slot = (ev.expected[0] if len(ev.expected) == 1 else None) if policy_victim else \
        ev.terminated[0] if len(ev.terminated) == 1 else (ev.expected[0] if len(ev.expected) == 1 else None)
    v = ev.at(victim_slot) if victim_slot is not None else None
    if v is None:
        return set()
    def bucket(s: SlotAt) -> str | None:
        n = undecoded(ev, s)
        return None if n is None else ">1" if n > 1 else str(n)
    nv = bucket(v)
    out = set()
    for s in ev.in_play:
        ns = bucket(s) if s.slot != v.slot else None
        if nv is not None and ns is not None:
            out.add(f"victim undecoded {nv} x survivor {'before' if s.position < v.position else 'after'}, "
                    f"undecoded {ns}")
    return out


def designed(ev: Overflow, wl: Workload) -> list[tuple[str, bool, str]]:
    """The shapes `wl` is designed to judge, measured on its overflow: (check name, held, why)."""
    out = []
    if wl.expect.shift:
        out.append(("shift-exercised", *shift_exercised(ev)))
    if wl.expect.shape == "decoded":
        out.append(("victim-entry-decoded", *decoded_first(ev)))
    elif wl.expect.shape == "prompt-not-largest":
        out.append(("cells-not-prompt", *prompt_not_largest(ev)))
    elif wl.expect.shape == "straddled":
        out.append(("victim-straddled", *straddled(ev)))
    if wl.expect.pairs:
        got = overflow_pairs(ev, policy_victim=True)
        miss = [p for p in wl.expect.pairs if p not in got]
        out.append(("designed-pairs", not miss, (f"missed {'; '.join(miss)} (reached: {'; '.join(sorted(got)) or 'none'})"
                                                 if miss else f"reached {'; '.join(wl.expect.pairs)}")
                    + f" at off {ev.off}, {ev.entries} entries"))
    return out


def other_adapters_in_park(run: Run, wl: Workload) -> tuple[bool, str]:
    """lora-resume-3's designed shape: a request with other LoRA adapters than a parked one decoded
    between its park and its resume, so the resume follows a batch that set other adapters (a
    request that arrives after the park waits for the resume instead: the shape missed)."""
    scale = {r.slot: r.lora or 0.0 for r in wl.requests}
    runs = decoded_while_parked(run)
    for p, who in runs:
        other = [s for s in who if scale.get(s) != scale.get(p.slot)]
        if other:
            return True, (f"slot{'s' if len(other) > 1 else ''} {', '.join(map(str, other))} (other adapters) "
                          f"decoded while slot {p.slot} was parked (from step {p.step})")
    return False, ("no request with other adapters decoded while one was parked"
                   + (" (" + "; ".join(f"slot {p.slot} parked at step {p.step}, beside it: {list(who) or 'none'}"
                                       for p, who in runs) + ")" if runs else ": nothing was parked and resumed"))


@lru_cache(maxsize=1)
def resume_headroom() -> int:
    """The cells a resume leaves free per running slot: the preemption families' [params] headroom
    (one value for all of them, a fast test holds it), read from park-slot's patch.toml."""
    from .patch import load_patch
    return int(load_patch("park-slot").params["headroom"])


def parked_past_headroom(run: Run, wl: Workload) -> tuple[bool, str]:
    """park-whole-pool's designed shape: a slot parked holding more than the pool less a resume's
    headroom, so it can come back only alone. Missed when the small request started generating
    first and the pool ran out while the large one was still in its prompt: the small one is parked,
    holding a few cells, and any resume rule brings it back."""
    edge = run.pool - resume_headroom()
    ps = [p for v in pauses(run).values() for p in v]
    past = [p for p in ps if p.cells_before > edge]
    if past:
        return True, f"slot {past[0].slot} parked holding {past[0].cells_before} cells (> {edge}: the pool less a resume's headroom)"
    return False, ("no slot parked holding more than the pool less a resume's headroom "
                   f"({edge}): " + ("; ".join(f"slot {p.slot} parked holding {p.cells_before}" for p in ps) or "no pause"))


def designed_park(run: Run, wl: Workload) -> list[tuple[str, bool, str]]:
    """The shape a preempting run is designed to reach (there is no overflow to read it on)."""
    reader = PARK_READERS.get(wl.expect.shape)
    return [("designed-shape", *reader(run, wl))] if reader and parks(run) else []


# a park's designed shape (workload.PARK_SHAPES) -> its reader
PARK_READERS = {PARK_SHAPE: other_adapters_in_park, PAST_HEADROOM: parked_past_headroom}


def shape(run: Run, wl: Workload, policy: str = "largest") -> str | None:
    """None when the run has the shape the workload is designed to judge; else why not.
    runner.py re-makes such a start while its budget lasts (every attempt is judged);
    compare.py judges either way. Shapes are designed for the largest policy: under another
    policy only the overflow itself is required."""
    hits = [o for o in run.outcomes if kv_outcome(o)]
    if policy == "largest" and (park := designed_park(run, wl)):
        return None if park[0][1] else park[0][2]
    if policy == "largest" and wl.expect.overflow_shape:
        evs = overflows(run, wl)
        if evs and len(evs[0].terminated) == 1:      # a candidate's run (the base errors all)
            bad = [why for _, ok, why in designed(evs[0], wl) if not ok]
            return bad[0] if bad else None
    if wl.expect.base == "all-error" and not hits and not parks(run):  # a preempting run: no error by design
        # an overflow workload whose requests never met in the pool (a late group joined after
        # the early ones were nearly done): measured from the step each first generated in
        first_step: dict[int, int] = {}
        for k, st in enumerate(steps(run)):
            for slot in st:
                first_step.setdefault(slot, k)
        spread = max(first_step.values()) - min(first_step.values()) if first_step else 0
        return (f"no overflow: the requests started generating up to {spread} steps apart"
                if first_step else "no overflow")
    return None
