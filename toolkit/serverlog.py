"""What upstream's verbose log says of a run (record.Trace: launches, batch entries, samples, errors,
retries), read against the client's own records. Pure functions.

A log is evidence only when it describes this run: `trace_problems` holds each slot's logged tokens
to its stream. `sampling_problems` holds each slot's decodes to its samples; `steps` gives every
decode step's entries; `not_stopped` finds a terminated request's task decoding on, or released only
after its step.
"""
from __future__ import annotations

from .record import Run

EXCEEDED = "Context size has been exceeded."
# the output parser's rejection of what a real model said (layout C2): its own outcome, never a
# termination by a full pool (docs/DESIGN.md, section 8)
REJECTED = "does not match the expected"


def kv_errors(trace) -> set[int]:
    """Indices of the trace's "error" entries that END a request because the pool was full, by what
    happened, not by their words: upstream's own text, or ANY error sent in a loop turn in which the
    KV cache failed to place a batch ("failed to find a memory slot" / "retrying with smaller batch
    size"). A fork's eviction may answer with a 503 and text of its own (issue 34)."""
    out, failed = set(), False
    for k, t in enumerate(trace):
        if t.kind in ("step", "loop"):
            failed = False
        elif t.kind in ("batch", "retry"):
            failed = True
        elif t.kind == "error" and (t.text == EXCEEDED or (failed and REJECTED not in t.text)):
            out.add(k)
    return out


def kv_outcome(o) -> bool:
    """A client-side outcome ended by a full pool: upstream's text, or any error that is not the
    output parser's (without a verbose log, the client cannot see the loop turn; the grouping by
    time in overflows() then decides which errors form one event)."""
    return o.outcome == "errored" and (o.error == EXCEEDED or REJECTED not in (o.error or ""))


def _logged_tokens(run: Run) -> dict[int, list[int]]:
    """Each slot's tokens as upstream's log lists them, for the first task the slot launched."""
    slot_of = {t.task: t.slot for t in run.trace if t.kind == "launch"}
    first: dict[int, int] = {}
    for t in run.trace:
        if t.kind == "launch":
            first.setdefault(t.slot, t.task)
    logged: dict[int, list[int]] = {}
    for t in run.trace:
        if t.kind == "token" and slot_of.get(t.task) == t.slot and first.get(t.slot) == t.task:
            logged.setdefault(t.slot, []).append(t.token)
    return logged


def log_truncated(run: Run) -> bool:
    """The log ends before the run did: the server's exit line is missing, every slot's logged
    tokens are a prefix of what its client received, and the client saw more: more tokens, or an
    error the log never shows (a request not streamed receives no tokens, only its answer).
    Measured under load: the server's asynchronous logger had not written the overflow when the
    log was read (a streamed base run; then overflow-nonstream's, in a cold clean-clone run).
    Missing evidence, not contrary evidence."""
    if any(t.kind == "exit" for t in run.trace):
        return False
    logged = _logged_tokens(run)
    slot_of = {t.task: t.slot for t in run.trace if t.kind == "launch"}
    errors_logged = {slot_of.get(t.task) for t in run.trace if t.kind == "error"}
    short = False
    for o in run.outcomes:
        got = tuple(logged.get(o.slot, []))
        if o.tokens and got != o.tokens[:len(got)]:
            return False
        short |= len(got) < len(o.tokens) or (o.outcome == "errored" and bool(o.error)
                                               and o.slot not in errors_logged)
    return short


def trace_problems(run: Run) -> list[str]:
    """Does upstream's log describe this run? Each slot's logged tokens must be the ones its client
    received, in order (a log of another run, or a garbled one, cannot pass as evidence)."""
    logged = _logged_tokens(run)
    problems = []
    for o in run.outcomes:
        if not o.tokens and o.slot not in logged:
            continue
        got = logged.get(o.slot, [])
        if tuple(got[:len(o.tokens)]) != o.tokens:
            problems.append(f"slot {o.slot}: the log's tokens are not the stream's")
    return problems


def sampling_problems(run: Run) -> tuple[list[str], list[int]]:
    """Upstream's log, slot by slot: the tokens a slot decodes ("slot decode token, id=...") must be
    exactly the tokens it sampled, in order, one entry per sample. A batch index left stale after
    entries moved breaks this where the token streams may not show it: the slot whose row moved is
    not sampled in that step and decodes its last token twice, while another slot samples its
    row (measured with `no-remap` on victim-middle failing at off 1: integrity passed because the
    tiny model's streams had fallen into the same short cycle; this check failed).
    Returns (problems, slots it cannot judge: fewer entries than samples, as speculative decoding
    accepts several drafted tokens per entry)."""
    first: dict[int, int] = {}
    entries: dict[int, list[int]] = {}
    samples: dict[int, list[int]] = {}
    cells: dict[int, int] = {}
    entry_step: dict[int, int] = {}   # slot -> the step of its last entry
    step = -1
    for t in run.trace:
        if t.kind == "launch":
            first.setdefault(t.slot, t.task)
        elif t.kind == "step":
            step += 1
        elif t.kind in ("entry", "token") and first.get(t.slot) == t.task:
            if t.kind == "entry":
                e = entries.setdefault(t.slot, [])
                if e and e[-1] == t.token and cells.get(t.slot) == t.value:
                    e.pop()  # the same token at the same cell count: the entry before was taken out of its
                             # batch undecoded (a preemption parked the slot) and is made again
                cells[t.slot] = t.value
                entry_step[t.slot] = step
                e.append(t.token)
            else:
                k, e = samples.setdefault(t.slot, []), entries.get(t.slot, [])
                if e and len(e) < len(k) and entry_step.get(t.slot, step) < step:
                    # a sample in a step where the slot had no entry, after its entries began, while
                    # its last sample has no entry yet: a resume's own. A recompute that decoded the
                    # pending token with the history (the fork's design, recompute-prefill-slot)
                    # samples its successor there: the pending token was decoded once, by that
                    # prefill, with no entry line of its own. Counted, not compared: the pending
                    # token may equal the one before it
                    e.append(k[-1])
                    entry_step[t.slot] = step
                k.append(t.token)
    problems, unjudged = [], []
    for slot in sorted(set(entries) | set(samples)):
        e, k = entries.get(slot, []), samples.get(slot, [])
        if len(e) < len(k) - 1:
            unjudged.append(slot)
            continue
        i = next((i for i, (a, b) in enumerate(zip(e, k)) if a != b), None)
        if i is not None:
            problems.append(f"slot {slot}: decode #{i} entered token {e[i]}, but its sample #{i} was {k[i]}"
                            + (" (the previous token again: a step without a sample)" if i and e[i] == e[i - 1] else ""))
        elif len(e) > len(k):
            problems.append(f"slot {slot}: {len(e)} tokens decoded for {len(k)} sampled")
    return problems, unjudged


def steps(run: Run) -> list[dict[int, int]]:
    """From upstream's verbose log: for every decode step, each generating slot's cells when the
    step began (its batch entry's "n_tokens"), in batch order. Empty without a verbose log."""
    out: list[dict[int, int]] = []
    cur: dict[int, int] | None = None
    first: dict[int, int] = {}  # each slot's workload task (a later probe request is not the workload's)
    for t in run.trace:
        if t.kind == "launch":
            first.setdefault(t.slot, t.task)
        elif t.kind == "step":
            cur = None
        elif t.kind == "entry" and first.get(t.slot) == t.task:
            if cur is None:
                cur = {}
                out.append(cur)
            cur[t.slot] = t.value
    return out




def not_stopped(run: Run) -> tuple[list[str], bool]:
    """A terminated request's task stops in the step that terminated it: it decodes nothing after
    the server sent it the context error, and its slot is released before that step ends.

    The second half is an order, not a race: the server takes queued tasks only between two
    update_slots calls ("start_loop: processing new tasks"; while decoding it declines them). The
    error ends the client's stream and upstream's HTTP layer then posts a cancel, which releases
    the slot too, but only at that boundary. So a patch that sends the error without releasing
    the slot is seen releasing it after the boundary, in every run, even when the cancel happens
    to beat the next step (measured: it always did, so its late entries never showed).
    Returns (problems, whether the release's step could be judged: the log has the loop's lines)."""
    slots = {o.slot for o in run.outcomes}
    first: dict[int, int] = {}
    for t in run.trace:
        if t.kind == "launch" and t.slot in slots:
            first.setdefault(t.slot, t.task)
    tasks = set(first.values())
    judged = any(t.kind == "loop" for t in run.trace)
    after: dict[int, int] = {}     # task -> entries after its first context error (one pass over the log)
    erred: dict[int, int] = {}     # task -> the loop segment of its first context error
    released: dict[int, list[int]] = {}  # task -> the loop segments it was released in
    seg = 0                        # loop segments: one update_slots call and the tasks taken before it
    kv = kv_errors(run.trace)
    for k, t in enumerate(run.trace):
        if t.kind == "loop":
            seg += 1
        elif t.kind == "error" and k in kv and t.task in tasks:
            erred.setdefault(t.task, seg)
            after.setdefault(t.task, 0)
        elif t.kind == "entry" and t.task in after:
            after[t.task] += 1
        elif t.kind == "release" and t.task in tasks:
            released.setdefault(t.task, []).append(seg)
    problems = []
    for task, n in after.items():
        slot = next(s for s, x in first.items() if x == task)
        if n:
            problems.append(f"slot {slot} (task {task}) had {n} batch entr{'y' if n == 1 else 'ies'} "
                            "after it was sent the error: it went on generating for nobody")
        segs = released.get(task, [])
        if judged and erred[task] not in segs:
            problems.append(f"slot {slot} (task {task}) was not released in the step that sent it the error: "
                            + ("released only after the step ended (as the HTTP layer's cancel releases it)"
                               if any(x > erred[task] for x in segs) else "never released in the log"))
    return problems, judged
