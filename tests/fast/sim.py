"""A step-by-step model of the server's unified-pool decode loop, to make recorded runs for the
fast tests: every slot samples one token per step; when the pool has fewer free cells than the
step has entries, the batch halves down to single entries, decodes until no cell is left, and
fails at off == free. Then the base errors every slot in play; the patched server terminates
one victim (the policy on cells at that moment) and goes on. Independent of measure.py on
purpose: it simulates the server forward, measure.py reasons backward from the client's records.
"""
from __future__ import annotations

from toolkit.record import Event, Outcome, Run, Sample, Trace

EXC = "Context size has been exceeded."


def simulate(prompts, n_predict, pool, *, launch=None, patched=True, policy="largest", dt=0.0002,
             jitter=None, snapshots=(), lie=False, log=True, evict_extra=False, verbose=True, key=None,
             text=None):
    """prompts/n_predict per slot; launch[slot] = the step its prompt is decoded (first token
    sampled); jitter(slot, k) -> extra arrival delay of its k-th token. snapshots: steps at which
    a /slots snapshot is taken (before that step's decode). lie: evict the runner-up and log it
    as the largest. evict_extra: also terminate the next slot in the same step (a broken patch).
    policy "newest": the slot launched last (task ids follow launch order here). key(slot) -> a
    per-slot quantity the victim is chosen by instead (a wrong patch), highest first. text: the
    patched server's own error text for its victims (a fork's eviction; default upstream's)."""
    n = len(prompts)
    launch = launch or [0] * n
    npred = n_predict if isinstance(n_predict, (list, tuple)) else [n_predict] * n
    jitter = jitter or (lambda slot, k: 0.0)
    gen = [0] * n                       # tokens sampled
    cells = [0] * n
    state = ["waiting"] * n             # waiting | gen | done | error
    times = [[] for _ in range(n)]
    t_end = [0.0] * n
    samples, events, trace = [], [], []
    toks = [[] for _ in range(n)]
    step = 0
    while any(s in ("waiting", "gen") for s in state) and step < 10_000:
        t = step * dt
        if step in snapshots:
            for j in range(n):
                samples.append(Sample(t, j, cells[j], state[j] == "gen", gen[j] if state[j] == "gen" else 0))
        entries = [j for j in range(n) if state[j] == "gen"]
        free = pool - sum(cells)
        trace.append(Trace("step"))
        for j in entries:  # upstream's "slot decode token ... n_tokens" line: cells when the step began
            trace.append(Trace("entry", j, j, cells[j], 10 + j + gen[j] - 1))

        def sample(j):  # the server samples right after each sub-batch it decodes
            cells[j] += 1
            if state[j] != "gen":
                return
            gen[j] += 1
            times[j].append(t + dt / 2 + jitter(j, gen[j]))
            trace.append(Trace("token", j, j, gen[j], 10 + j + gen[j] - 1))
            if gen[j] >= npred[j]:
                state[j], t_end[j] = "done", times[j][-1]
                cells[j] = 0

        if len(entries) > free:
            off = free
            trace.append(Trace("batch", value=len(entries)))
            for j in entries[:off]:
                sample(j)
            trace.append(Trace("retry", value=off, token=1))
            held = {j: cells[j] for j in entries if state[j] == "gen"}
            if not patched or len(held) < 2:
                for j in held:
                    state[j], t_end[j] = "error", t + 0.0001
                    cells[j] = 0
                    trace.append(Trace("error", task=j, text=EXC))
                events.append(Event("error-all", off))
            else:
                by = key or {"largest": lambda j: held[j], "smallest": lambda j: -held[j],
                             "newest": lambda j: (launch[j], j)}[policy]
                ranked = sorted(held, key=by, reverse=True)
                victim = ranked[1] if lie else ranked[0]
                claimed = held[ranked[0]] + 1 if lie else held[victim]
                out = [victim] + ([ranked[1] if not lie else ranked[2]] if evict_extra else [])
                if log:
                    for v in out:
                        others = tuple((j, held[j]) for j in held if j != v)
                        events.append(Event("evict", off, v, claimed if v == victim else held[v], others))
                for v in out:
                    state[v], t_end[v] = "error", t + 0.0001
                    cells[v] = 0
                    trace.append(Trace("error", task=v, text=text or EXC))
                for j in entries[off:]:
                    if state[j] == "gen":
                        sample(j)
        else:
            for j in entries:
                sample(j)
        for j in range(n):
            if state[j] == "waiting" and launch[j] == step:
                cells[j] = prompts[j]
                gen[j] = 1
                trace.append(Trace("launch", j, j))
                trace.append(Trace("token", j, j, 1, 10 + j))
                state[j] = "gen"
                times[j].append(t + dt / 2 + jitter(j, 1))
        step += 1
    outs = []
    for j in range(n):
        toks = tuple(range(10 + j, 10 + j + gen[j]))
        if state[j] == "done":
            outs.append(Outcome(j, "completed", 200, None, True, "limit", False, gen[j], toks, prompts[j], npred[j],
                                0.0, times[j][0], t_end[j], tuple(sorted(times[j]))))
        else:
            outs.append(Outcome(j, "errored", 200, EXC if not patched or text is None else text, False, None, None,
                                None, toks, prompts[j], npred[j],
                                0.0, times[j][0] if times[j] else None, t_end[j], tuple(sorted(times[j]))))
    trace.append(Trace("exit"))
    return Run("sim", tuple(outs), tuple(samples), tuple(events), True, None, step * dt, "log",
               pool=pool, trace=tuple(trace) if verbose else ())
