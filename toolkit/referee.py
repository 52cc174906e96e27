"""The referee: every answer to a full KV cache, on the same workloads and model, in one table.

Strategies are the unpatched base (every slot fails), terminate (the eviction patch) and the
preemption families (park by swap, recompute), each with a victim policy. Each candidate is one
render on the shared base build (one TU), run on the same workloads; the base runs and the
no-overflow control of each workload are made once and shared (verify.run_suite's `reuse`). Every
figure is measured from the runs: the clients' streams and clocks, upstream's verbose log (pauses).
Each candidate is also judged by its own expectations (eviction / preemption), so a strategy that
wins a column while breaking its promise shows as FAIL in the same row.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import git

from . import apply as apply_mod
from . import build as build_mod
from . import compare, measure
from . import patch as patch_mod
from . import promises as promises_mod
from . import verify as verify_mod
from .record import Run
from .workload import Workload

def strategies() -> dict[str, tuple[str | None, str]]:
    """strategy name -> (patch family or None for the base, its mode for the table). Each family
    declares its strategy in its patch.toml (`strategy`, and `params.mode`): a family added as a
    folder (patches/ or PATCHKIT_FAMILIES) is a referee row with no code naming it."""
    out: dict[str, tuple[str | None, str]] = {"base": (None, "none")}
    for fam in patch_mod.families():
        spec = patch_mod.load_patch(fam)
        if spec.strategy:
            out[spec.strategy] = (fam, str(spec.params.get("mode", spec.strategy)))
    return out


DEFAULT = ("base", "terminate:largest", "park:largest", "park:smallest", "park:not-leader-smallest",
           "recompute:largest", "recompute:smallest", "hybrid:largest")
# many-resumes-8 runs for seconds, not a fraction of one: a makespan there is not start-up noise
DEFAULT_WORKLOADS = ("overflow-4", "staggered", "overflow-8", "staggered-8", "many-resumes-8")


@dataclass(frozen=True)
class Entry:
    strategy: str        # base | terminate | park | recompute
    policy: str          # the victim policy ("" for the base)

    @property
    def label(self) -> str:
        return self.strategy + (f":{self.policy}" if self.policy else "")


@dataclass(frozen=True)
class Row:
    """One strategy on one workload (one run), measured."""
    entry: str
    workload: str
    completed: int
    total: int
    collateral: int          # failed requests beyond one per overflow (the victims a strategy may take)
    makespan_s: float        # first request sent -> last request ended
    tok_s: float             # tokens streamed to clients / makespan
    slowest_s: float         # the longest request, sent -> ended
    parks: int
    recomputed: int          # cells recomputed on resume (a recompute's wasted work); 0 for swap
    longest_pause_s: float
    most_parks: int          # the most pauses one request had
    exact: str               # streams equal to the control: "4/4", or where the first differs
    verdict: str             # PASS / FAIL of the strategy's own expectations (which ones: `expect`)
    expect: str
    failed_checks: tuple[str, ...] = ()
    run: int = 1             # the repetition (1..repeat)


@dataclass(frozen=True)
class TrafficTable:
    """Every strategy on one traffic workload (toolkit/traffic.py), `repeat` runs each: a row per
    strategy (goodput, p99 latency, exact runs, failed attempts) and the claims the runs allow."""
    workload: str
    rows: tuple           # traffic.StrategyRow, in the table's strategy order
    claims: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    base_commit: str
    layout: str | None
    model: str
    rows: tuple[Row, ...]    # one per strategy, workload and repetition
    seconds: float
    build_s: dict            # entry -> seconds its candidate build took (0 when cached)
    repeat: int = 1
    command: str = ""        # the command that reproduces it (the PR comment quotes it)
    promises: tuple[tuple[str, str], ...] = ()  # (candidate row, what it was judged to promise and whence)
    traffic: tuple[TrafficTable, ...] = ()      # --traffic: every strategy on the users' chat traffic


# A ranking claims only what the runs show: on one workload, A is measurably faster than B when every
# run of A ends before every run of B (the rank test's extreme, Mann-Whitney U = 0), whose exact
# two-sided p under "no difference" is 2 / C(nA + nB, nA): 0.1 for 3 runs each, 0.008 for 5, and
# the table holds several pairs, so the claims are Holm-corrected (claims()). Otherwise the table
# says "no measurable difference".
ALPHA = 0.05


def u_zero_p(n_a: int, n_b: int) -> float:
    """Exact one-sided p of Mann-Whitney U = 0 with samples of n_a and n_b and no ties."""
    from math import comb
    return 1 / comb(n_a + n_b, n_a)


@dataclass(frozen=True)
class Summary:
    """One strategy on one workload over its repetitions: the median and the range of each figure."""
    entry: str
    workload: str
    runs: int
    completed: int           # over all runs
    total: int
    makespan: tuple[float, float, float]   # (median, min, max), seconds
    tok_s: tuple[float, float, float]
    slowest: tuple[float, float, float]
    parks: tuple[float, float, float]      # per run (a round of the workload's requests)
    verdicts: str            # "3/3 PASS", "-" for the base
    exact: str               # runs whose every stream equalled its control


def _spread(xs: list[float]) -> tuple[float, float, float]:
    import statistics
    return (round(statistics.median(xs), 3), round(min(xs), 3), round(max(xs), 3))


def summaries(t: Table) -> list[Summary]:
    out = []
    for key in dict.fromkeys((r.workload, r.entry) for r in t.rows):
        rs = [r for r in t.rows if (r.workload, r.entry) == key]
        judged = [r for r in rs if r.verdict != "-"]
        out.append(Summary(key[1], key[0], len(rs), sum(r.completed for r in rs), sum(r.total for r in rs),
                           _spread([r.makespan_s for r in rs]), _spread([r.tok_s for r in rs]),
                           _spread([r.slowest_s for r in rs]), _spread([float(r.parks) for r in rs]),
                           f"{sum(r.verdict == 'PASS' for r in judged)}/{len(judged)} PASS" if judged else "-",
                           f"{sum(map(_exact, rs))}/{len(rs)}" if rs[0].exact != "-" else "-"))
    return out


def _exact(r: Row) -> bool:
    """Did every stream of the run equal its control ("4/4", not "3/4 (slot 2 from token 9)")?"""
    equal, _, total = r.exact.split(" ")[0].partition("/")
    return equal == total


def claims(by: dict[str, list[float]], alpha: float = ALPHA) -> list[tuple[str, str, float]]:
    """(faster, slower, p) for every pair the runs separate, corrected for the number of pairs
    compared (Holm): a pair is separated when every run of one ended before every run of the other
    (Mann-Whitney U = 0), whose exact two-sided p under "no difference" is 2 / C(n + m, n); the
    direction is read from the data, hence two-sided. Holm's step-down over all m(m-1)/2 pairs
    keeps the chance of any false claim in a table at most `alpha`, whatever the strategies are
    (a fast test simulates identical ones). A pair the runs do not separate counts as p = 1."""
    from itertools import combinations
    from math import comb
    tests = []
    for a, b in combinations(sorted(by), 2):
        xa, xb = by[a], by[b]
        if max(xa) < min(xb):
            tests.append((min(1.0, 2 / comb(len(xa) + len(xb), len(xa))), a, b))
        elif max(xb) < min(xa):
            tests.append((min(1.0, 2 / comb(len(xa) + len(xb), len(xa))), b, a))
    k = len(by) * (len(by) - 1) // 2
    out = []
    for i, (p, fast, slow) in enumerate(sorted(tests)):
        if p > alpha / (k - i):
            break
        out.append((fast, slow, p))
    return out


def ranking(t: Table, workload: str) -> str:
    """Which strategy finished the workload first, said only where the runs separate it from the
    others after correcting for the number of pairs compared (claims()). Only strategies whose
    every run PASSED its own expectations and completed every request are raced; the others are
    named, never ranked."""
    rows = [r for r in t.rows if r.workload == workload]
    failing = sorted({r.entry for r in rows if r.verdict not in ("PASS", "-")})
    # a strategy that fails requests finishes sooner by doing less: only those that complete every
    # request in every run are raced against each other
    short = sorted({r.entry for r in rows if r.completed < r.total and r.entry not in failing})
    by: dict[str, list[float]] = {}
    for r in rows:
        if r.entry not in short and r.entry not in failing and r.verdict == "PASS":
            by.setdefault(r.entry, []).append(r.makespan_s)
    left_out = (f" (not raced, they fail requests by design: {', '.join(short)})" if short else "") + (
        f" (not ranked, a run of theirs did not PASS its expectations: {', '.join(failing)})" if failing else "")
    if len(by) < 2:
        return "fewer than two passing strategies that complete every request: nothing to rank" + left_out
    import statistics
    order = sorted(by, key=lambda e: statistics.median(by[e]))
    best = order[0]
    won = claims(by)
    beaten = {slow for fast, slow, _ in won if fast == best}
    pairs = len(by) * (len(by) - 1) // 2
    how = f"every run of one ended before every run of the other, Holm-corrected over {pairs} pair(s), alpha {ALPHA}"
    if beaten == set(order[1:]):
        p = max(p for fast, _, p in won if fast == best)
        return f"{best} is measurably fastest ({how}; largest p {p:.3f})" + left_out
    ties = [e for e in order[1:] if e not in beaten]
    return (f"no measurable difference between {best} and {', '.join(ties)} (ranges overlap, or too few runs "
            f"to tell {pairs} pair(s) apart: {how})"
            + (f"; measurably behind {best}: {', '.join(e for e in order[1:] if e in beaten)}" if beaten else "")
            + left_out)


def parse(entries: tuple[str, ...]) -> list[Entry]:
    from .errors import UsageError

    out = []
    known = strategies()  # every family's patch.toml, read once
    for e in entries:
        strat, _, policy = e.partition(":")
        if strat not in known:
            raise UsageError(f"unknown strategy '{strat}' in '{e}'; known: {', '.join(known)} "
                             "(each but base as STRATEGY:POLICY, e.g. park:smallest).")
        fam = known[strat][0]
        if fam is None:
            if policy:
                raise UsageError("the base has no policy: write `base`.")
        else:
            policy = policy or "largest"
            allowed = patch_mod.load_patch(fam).policies
            if policy not in allowed:
                raise UsageError(f"'{e}': {strat} offers the policies {', '.join(allowed)}.")
        out.append(Entry(strat, policy))
    return out


def row(entry: Entry, wl: Workload, run: Run, control: Run | None, verdict, expect: str, k: int = 1) -> Row:
    outs = run.outcomes
    failed = [o for o in outs if o.outcome != "completed"]
    n_overflows = len(measure.overflows(run, wl)) if failed else 0
    t0 = min(o.t_start for o in outs)
    makespan = max(o.t_end for o in outs) - t0
    ps = measure.pauses(run)
    all_p = [p for v in ps.values() for p in v]
    recompute = strategies().get(entry.strategy, (None, ""))[1] == "recompute"
    exact = "-"
    if control is not None:
        ctl = {o.slot: o for o in control.outcomes}
        diffs = []
        for o in outs:
            pos = compare.first_difference(o.tokens, ctl[o.slot].tokens) if o.slot in ctl else 0
            if pos is not None and not (o.outcome != "completed" and pos >= len(o.tokens)):  # a victim: a prefix
                diffs.append((o.slot, pos))
        exact = f"{len(outs) - len(diffs)}/{len(outs)}" + (
            "" if not diffs else f" (slot {diffs[0][0]} from token {diffs[0][1]})")
    return Row(entry.label, wl.name, len(outs) - len(failed), len(outs), max(0, len(failed) - n_overflows),
               round(makespan, 3), round(sum(len(o.tokens) for o in outs) / makespan, 1) if makespan > 0 else 0.0,
               round(max(o.t_end - o.t_start for o in outs), 3), len(all_p),
               sum(p.cells for p in all_p if p.resumed) if recompute else 0,
               round(max((p.seconds or 0.0 for p in all_p), default=0.0), 3),
               max((len(v) for v in ps.values()), default=0), exact,
               "-" if verdict is None else "PASS" if verdict.ok else "FAIL", expect,
               tuple(f"{c.name}: {c.detail}" for c in (verdict.checks if verdict else ()) if c.status == "fail"), k)


def _rows(entry: Entry, wr, expect: str, base_too: bool) -> list[Row]:
    """Every repetition of one workload's result: the base's runs (once per table), then the entry's."""
    out = [row(Entry("base", ""), wr.workload, r, wr.control, None, "none", k)
           for k, r in enumerate(wr.base, 1)] if base_too else []
    for k, run in enumerate(wr.candidate, 1):
        v = next((v for v in wr.verdicts if v.side == "candidate" and v.run_index == k - 1), None)
        out.append(row(entry, wr.workload, run, wr.control, v, expect, k))
    return out


def referee(repo: git.Repo, base: str, entries: list[Entry], workloads: list[Workload], *,
            model_name: str | None = None, opts: build_mod.Options = build_mod.Options(), out_dir: Path,
            say: Callable[[str], None] = print, progress: Callable[[str], None] = lambda s: None,
            candidates: tuple[tuple[str, dict[str, str], tuple[str, ...]], ...] = (), repeat: int = 1,
            command: str = "", declared: dict[str, Path] | None = None, traffics: tuple = ()) -> Table:
    """`candidates`: (ref, server environment, server flags) rows beside the strategies: any ref of
    `repo` (a fork's PR branch), judged by what it measurably does (`--expect auto`) and by what it
    promises (`declared`: ref -> promises file; else its trailer or patchkit's code, promises.py); its environment
    and flags its own (e.g. a knob the PR reads, `--preempt-ram 0`). `repeat`: runs per row.
    `traffics`: traffic.Traffic workloads each row also serves (its promise: a preemption ends no
    request, anything else one per overflow), every turn against its solo control on the base."""
    t0 = time.monotonic()
    reuse: dict = {}
    rows: list[Row] = []
    builds: dict[str, float] = {}
    layout = None
    base_rows_done = False
    known = strategies()  # every family's patch.toml, read once
    said: list[tuple[str, str]] = []
    # (row, candidate commit, what it promises: its traffic promise, and whether queued requests wait for a park)
    served: list[tuple[str, str, str, bool]] = []
    for entry in entries:
        fam = known[entry.strategy][0]
        if fam is None:
            continue  # the base's rows come with the first candidate's shared runs
        spec = patch_mod.load_patch(fam)
        say(f"== {entry.label}: {spec.summary}")
        cand, an = apply_mod.candidate_commit(repo, base, fam, entry.policy, None, opts, progress)
        layout = layout or (an.facts.layout if an.facts else None)
        res = verify_mod.run_suite(repo, base, cand, workloads, work_dir=out_dir / entry.label.replace(":", "-"),
                                   repeat=repeat, opts=opts, policy=entry.policy, candidate_label=f"{entry.label}", layout=layout,
                                   model_name=model_name, expect="auto", evicting_patch=True, reuse=reuse,
                                   say=say, progress=progress, patch_expect=spec.expect, family=spec.name)
        builds[entry.label] = dict(res.timings).get("build candidate", 0.0)
        served.append((entry.label, cand, spec.expect, spec.expect == "preemption"))   # promises.of_family
        for wr in res.results:
            rows += _rows(entry, wr, res.expect, not base_rows_done and any(e.strategy == "base" for e in entries))
        base_rows_done = True
    from .source import resolve
    for ref, env, args in candidates:
        label = f"ref {ref}" + "".join(f" {k}={v}" for k, v in env.items()) + "".join(f" {a}" for a in args)
        say(f"== {label}: a candidate of the repository, judged by what it measurably does")
        cand = resolve(repo, ref)
        # what it promises beyond the property: declared, its trailer, or patchkit's code in it
        own = promises_mod.of_candidate(repo, base, cand, declared=(declared or {}).get(ref))
        said.append((label, own.text if own else "none found: judged on the property alone"))
        say(f"   promises: {said[-1][1]}")
        res = verify_mod.run_suite(repo, base, cand, workloads, work_dir=out_dir / f"ref-{len(rows)}", opts=opts,
                                   repeat=repeat, policy=own.policy if own else "largest",
                                   candidate_label=label, layout=layout, model_name=model_name, expect="auto",
                                   evicting_patch=own is not None, reuse=reuse, say=say, progress=progress,
                                   candidate_env=env, candidate_args=args,
                                   patch_expect=own.expect if own else "eviction", declared=own,
                                   family=own.family if own else "")
        builds[label] = dict(res.timings).get("build candidate", 0.0)
        served.append((label, cand, own.expect if own else "eviction", bool(own and own.own.parked_first)))
        for wr in res.results:
            rows += _rows(Entry(label, ""), wr, res.expect,
                          not base_rows_done and any(e.strategy == "base" for e in entries))
        base_rows_done = True
        entries = [*entries, Entry(label, "")]
    order = {e.label: i for i, e in enumerate(entries)}
    wl_order = {w.name: i for i, w in enumerate(workloads)}
    rows.sort(key=lambda r: (wl_order[r.workload], order.get(r.entry, -1), r.run))
    tables = _traffic(repo, base, traffics, served, any(e.strategy == "base" for e in entries), opts=opts,
                      out_dir=out_dir / "traffic", repeat=repeat, say=say, progress=progress)
    return Table(base, layout, model_name or workloads[0].model, tuple(rows), round(time.monotonic() - t0, 1), builds,
                 repeat, command, tuple(said), tables)


def _traffic(repo: git.Repo, base: str, traffics, served: list[tuple[str, str, str, bool]], with_base: bool, *,
             opts: build_mod.Options, out_dir: Path, repeat: int, say, progress) -> tuple[TrafficTable, ...]:
    """Each traffic workload served by every row's build (cached by content: the lab rows built
    them), `repeat` times; the base's runs come with the first row's. The traffic's own model
    serves it (a chat template), whatever `--model` the laboratory rows used."""
    from . import traffic as traffic_mod

    out = []
    base_bin = build_mod.build(repo, base, opts, progress).binary if traffics else None
    for t in traffics:
        by: dict[str, tuple] = {}
        for k, (label, cand, expect, parked_first) in enumerate(served):
            say(f"== traffic {t.name}: {label}")
            res = traffic_mod.compare(base_bin, build_mod.build(repo, cand, opts, progress).binary, t,
                                      out_dir / label.replace(":", "-").replace("/", "-").replace(" ", "_"),
                                      promise="preemption" if expect == "preemption" else "one-victim",
                                      parked_first=parked_first,
                                      with_base=with_base and k == 0, repeat=repeat, say=say)
            if res.base:
                by["base"] = res.base      # the first row's: the table's first
            by[label] = res.candidate
        out.append(TrafficTable(t.name, *traffic_mod.strategy_rows(t, by)))
    return tuple(out)


COLUMNS = (("strategy", "entry"), ("completed", None), ("collateral", "collateral"), ("makespan s", "makespan_s"),
           ("tok/s", "tok_s"), ("slowest s", "slowest_s"), ("parks", "parks"), ("recomputed", "recomputed"),
           ("longest pause s", "longest_pause_s"), ("most parks", "most_parks"), ("exact", "exact"),
           ("verdict", "verdict"))


def cells(r: Row) -> list[str]:
    return [f"{r.completed}/{r.total}" if k is None else str(getattr(r, k)) for _, k in COLUMNS]


def markdown(t: Table) -> str:
    lines = ["# The referee: every answer to a full KV cache, measured",
             "", f"base `{t.base_commit[:12]}`, layout {t.layout}, model {t.model}, {t.repeat} run(s) per row; "
             f"{t.seconds:.0f} s in all.", ""]
    lines += [f"- {label} promises: {text}" for label, text in t.promises] + ([""] if t.promises else [])
    for wl in dict.fromkeys(r.workload for r in t.rows):
        lines += [f"## {wl}", ""]
        if t.repeat > 1:
            lines += summary_table(t, wl) + [""]
        else:
            lines += ["| " + " | ".join(h for h, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
            lines += ["| " + " | ".join(cells(r)) + " |" for r in t.rows if r.workload == wl]
        fails = [r for r in t.rows if r.workload == wl and r.failed_checks]
        lines += [""] + [f"- {r.entry} (run {r.run}) FAIL: " + "; ".join(r.failed_checks) for r in fails]
        lines += [f"- ranking: {ranking(t, wl)}", ""]
    for tt in t.traffic:
        lines += [f"## traffic {tt.workload}", "", *traffic_lines(tt), ""]
    lines += ["Columns: completed / total requests; collateral = failed requests beyond one per overflow; makespan ="
              " first request sent to last ended; tok/s = tokens streamed / makespan; parks = pauses measured in "
              "upstream's log; recomputed = cells recomputed on resume; exact = streams equal to the no-overflow "
              "control (a terminated request's, if a prefix of it); verdict = the strategy's own expectations "
              "(base: none judged here)."]
    return "\n".join(lines) + "\n"


def traffic_lines(tt: TrafficTable) -> list[str]:
    from . import traffic as traffic_mod
    return traffic_mod.referee_rows(tt.rows, tt.claims)


SUMMARY_COLUMNS = ("strategy", "completed", "wall s", "slowest request s", "aggregate tok/s", "parks per round",
                   "exact runs", "verdict")


def _mmm(x: tuple[float, float, float], digits: int = 3) -> str:
    med, lo, hi = x
    return f"{med:.{digits}f}" + ("" if lo == hi else f" ({lo:.{digits}f}-{hi:.{digits}f})")


def summary_table(t: Table, workload: str) -> list[str]:
    """The columns the fork's authors measure by hand: wall, slowest request, aggregate tok/s, parks
    per round (one run of the workload's requests); each the median over the runs, its range after."""
    out = ["| " + " | ".join(SUMMARY_COLUMNS) + " |", "|" + "---|" * len(SUMMARY_COLUMNS)]
    for m in summaries(t):
        if m.workload == workload:
            out.append(f"| {m.entry} | {m.completed}/{m.total} | {_mmm(m.makespan)} | {_mmm(m.slowest)} | "
                       f"{_mmm(m.tok_s, 1)} | {_mmm(m.parks, 1)} | {m.exact} | {m.verdicts} |")
    return out


def pr_comment(t: Table) -> str:
    """The table as a pull-request comment: what was run, every workload's medians and ranges, what is
    measurably different and what is not, and the command that reproduces it."""
    lines = [f"### patchkit referee: {t.repeat} run(s) per strategy and workload",
             "", f"Base `{t.base_commit[:12]}` (layout {t.layout}), model {t.model}. Each figure is the median of "
             f"the runs, its range in brackets; a strategy is named faster only where every run of it ended "
             f"before every run of the other (rank test, Holm-corrected over every pair, alpha {ALPHA}).", ""]
    for wl in dict.fromkeys(r.workload for r in t.rows):
        lines += [f"**{wl}**", "", *summary_table(t, wl), "", f"Ranking: {ranking(t, wl)}.", ""]
    for tt in t.traffic:
        lines += [f"**traffic {tt.workload}** (chat sessions through the `openai` client, every turn against its "
                  "solo control)", "", *traffic_lines(tt), ""]
    failed = sorted({r.entry for r in t.rows if r.verdict == "FAIL"}
                    | {r.entry for tt in t.traffic for r in tt.rows if r.outcome == "FAIL"})
    lines += [f"Verdicts: {'every patched strategy passed its own expectations' if not failed else 'FAIL: ' + ', '.join(failed)}.",
              "", "Reproduce:", "", "```", t.command or "patchkit referee", "```", ""]
    return "\n".join(lines)


def svg(t: Table) -> str:
    """Makespan per strategy and workload: the median as a bar, the range of the runs as a whisker
    (failed requests marked red, parked runs blue)."""
    ms = summaries(t)
    top = max((m.makespan[2] for m in ms), default=1.0) or 1.0
    h, w, label_w = 18, 760, 260
    scale = (w - label_w - 150) / top
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h * len(ms) + 30}" font-size="11" '
           'font-family="sans-serif">']
    for i, m in enumerate(ms):
        y = i * h + 4
        med, lo, hi = m.makespan
        colour = "#c0392b" if m.completed < m.total else "#2e86c1" if m.parks[0] else "#7f8c8d"
        out.append(f'<text x="0" y="{y + 12}">{m.workload} · {m.entry}</text>')
        out.append(f'<rect x="{label_w}" y="{y}" width="{med * scale:.1f}" height="{h - 4}" fill="{colour}"/>')
        if hi > lo:
            out.append(f'<line x1="{label_w + lo * scale:.1f}" x2="{label_w + hi * scale:.1f}" y1="{y + (h - 4) / 2}" '
                       f'y2="{y + (h - 4) / 2}" stroke="black"/>')
        out.append(f'<text x="{label_w + hi * scale + 4:.1f}" y="{y + 12}">{_mmm(m.makespan, 2)} s, '
                   f'{m.completed}/{m.total}{f", {m.parks[0]:g} parks" if m.parks[0] else ""}</text>')
    out.append(f'<text x="0" y="{h * len(ms) + 24}">makespan, median of {t.repeat} run(s), whisker: their range (grey: '
               'no park; blue: parked; red: requests failed)</text></svg>')
    return "\n".join(out)


def to_json(t: Table) -> dict:
    from dataclasses import asdict
    wls = list(dict.fromkeys(r.workload for r in t.rows))
    return {"schema": "patchkit-referee/2", "base_commit": t.base_commit, "layout": t.layout, "model": t.model,
            "repeat": t.repeat, "command": t.command, "seconds": t.seconds, "build_s": t.build_s,
            "promises": dict(t.promises),
            "rows": [asdict(r) for r in t.rows], "summaries": [asdict(m) for m in summaries(t)],
            "ranking": {wl: ranking(t, wl) for wl in wls},
            "traffic": [{"workload": tt.workload, "rows": [asdict(r) for r in tt.rows], "claims": list(tt.claims)}
                        for tt in t.traffic]}


def write(t: Table, out_dir: Path, comment: Path | None = None) -> dict[str, Path]:
    import html
    import json

    out_dir.mkdir(parents=True, exist_ok=True)
    md = markdown(t)
    paths = {"json": out_dir / "report.json", "md": out_dir / "report.md", "html": out_dir / "report.html"}
    paths["json"].write_text(json.dumps(to_json(t), indent=2))
    paths["md"].write_text(md)
    if comment is not None:
        comment.parent.mkdir(parents=True, exist_ok=True)
        comment.write_text(pr_comment(t))
        paths["comment"] = comment
    table_html = []
    for wl in dict.fromkeys(r.workload for r in t.rows):
        table_html.append(f"<h2>{html.escape(wl)}</h2><table><tr>" + "".join(f"<th>{h}</th>" for h, _ in COLUMNS)
                          + "</tr>" + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells(r)) + "</tr>"
                                              for r in t.rows if r.workload == wl) + "</table>")
    paths["html"].write_text(
        "<!doctype html><meta charset=utf-8><title>patchkit referee</title><style>body{font-family:sans-serif}"
        "td,th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}td:first-child{text-align:left}</style>"
        f"<h1>The referee</h1><p>base {t.base_commit[:12]}, layout {t.layout}, model {html.escape(t.model)}</p>"
        + svg(t) + "".join(table_html)
        + "".join(f"<h2>traffic {html.escape(tt.workload)}</h2><pre>{html.escape(chr(10).join(traffic_lines(tt)))}</pre>"
                  for tt in t.traffic))
    return paths
