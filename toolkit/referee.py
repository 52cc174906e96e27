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
           "recompute:largest", "recompute:smallest")
DEFAULT_WORKLOADS = ("overflow-4", "staggered", "overflow-8", "staggered-8")


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


@dataclass(frozen=True)
class Table:
    base_commit: str
    layout: str | None
    model: str
    rows: tuple[Row, ...]
    seconds: float
    build_s: dict            # entry -> seconds its candidate build took (0 when cached)


def parse(entries: tuple[str, ...]) -> list[Entry]:
    from .errors import UsageError

    out = []
    for e in entries:
        strat, _, policy = e.partition(":")
        known = strategies()
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


def row(entry: Entry, wl: Workload, run: Run, control: Run | None, verdict, expect: str) -> Row:
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
               tuple(f"{c.name}: {c.detail}" for c in (verdict.checks if verdict else ()) if c.status == "fail"))


def referee(repo: git.Repo, base: str, entries: list[Entry], workloads: list[Workload], *,
            model_name: str | None = None, opts: build_mod.Options = build_mod.Options(), out_dir: Path,
            say: Callable[[str], None] = print, progress: Callable[[str], None] = lambda s: None,
            candidates: tuple[tuple[str, dict[str, str]], ...] = ()) -> Table:
    """`candidates`: (ref, server environment) rows beside the strategies: any ref of `repo` (a fork's
    PR branch), judged by what it measurably does (`--expect auto`), its environment its own (e.g.
    a knob the PR reads)."""
    t0 = time.monotonic()
    reuse: dict = {}
    rows: list[Row] = []
    builds: dict[str, float] = {}
    layout = None
    base_rows_done = False
    for entry in entries:
        fam = strategies()[entry.strategy][0]
        if fam is None:
            continue  # the base's rows come with the first candidate's shared runs
        spec = patch_mod.load_patch(fam)
        say(f"== {entry.label}: {spec.summary}")
        cand, an = apply_mod.candidate_commit(repo, base, fam, entry.policy, None, opts, progress)
        layout = layout or (an.facts.layout if an.facts else None)
        res = verify_mod.run_suite(repo, base, cand, workloads, work_dir=out_dir / entry.label.replace(":", "-"),
                                   opts=opts, policy=entry.policy, candidate_label=f"{entry.label}", layout=layout,
                                   model_name=model_name, expect="auto", evicting_patch=True, reuse=reuse,
                                   say=say, progress=progress, patch_expect=spec.expect)
        builds[entry.label] = dict(res.timings).get("build candidate", 0.0)
        for wr in res.results:
            if not base_rows_done and any(e.strategy == "base" for e in entries):
                rows.append(row(Entry("base", ""), wr.workload, wr.base[0], wr.control, None, "none"))
            v = next((v for v in wr.verdicts if v.side == "candidate"), None)
            rows.append(row(entry, wr.workload, wr.candidate[0], wr.control, v, res.expect))
        base_rows_done = True
    from .source import resolve
    for ref, env in candidates:
        label = f"ref {ref}" + "".join(f" {k}={v}" for k, v in env.items())
        say(f"== {label}: a candidate of the repository, judged by what it measurably does")
        cand = resolve(repo, ref)
        res = verify_mod.run_suite(repo, base, cand, workloads, work_dir=out_dir / f"ref-{len(rows)}", opts=opts,
                                   candidate_label=label, layout=layout, model_name=model_name, expect="auto",
                                   evicting_patch=False, reuse=reuse, say=say, progress=progress,
                                   candidate_env=env)
        builds[label] = dict(res.timings).get("build candidate", 0.0)
        for wr in res.results:
            if not base_rows_done and any(e.strategy == "base" for e in entries):
                rows.append(row(Entry("base", ""), wr.workload, wr.base[0], wr.control, None, "none"))
            v = next((v for v in wr.verdicts if v.side == "candidate"), None)
            rows.append(row(Entry(label, ""), wr.workload, wr.candidate[0], wr.control, v, res.expect))
        base_rows_done = True
        entries = [*entries, Entry(label, "")]
    order = {e.label: i for i, e in enumerate(entries)}
    wl_order = {w.name: i for i, w in enumerate(workloads)}
    rows.sort(key=lambda r: (wl_order[r.workload], order.get(r.entry, -1)))
    return Table(base, layout, model_name or workloads[0].model, tuple(rows), round(time.monotonic() - t0, 1), builds)


COLUMNS = (("strategy", "entry"), ("completed", None), ("collateral", "collateral"), ("makespan s", "makespan_s"),
           ("tok/s", "tok_s"), ("slowest s", "slowest_s"), ("parks", "parks"), ("recomputed", "recomputed"),
           ("longest pause s", "longest_pause_s"), ("most parks", "most_parks"), ("exact", "exact"),
           ("verdict", "verdict"))


def cells(r: Row) -> list[str]:
    return [f"{r.completed}/{r.total}" if k is None else str(getattr(r, k)) for _, k in COLUMNS]


def markdown(t: Table) -> str:
    lines = [f"# The referee: every answer to a full KV cache, measured",
             "", f"base `{t.base_commit[:12]}`, layout {t.layout}, model {t.model}; {t.seconds:.0f} s in all.", ""]
    for wl in dict.fromkeys(r.workload for r in t.rows):
        lines += [f"## {wl}", "", "| " + " | ".join(h for h, _ in COLUMNS) + " |",
                  "|" + "---|" * len(COLUMNS)]
        for r in (r for r in t.rows if r.workload == wl):
            lines.append("| " + " | ".join(cells(r)) + " |")
        fails = [r for r in t.rows if r.workload == wl and r.failed_checks]
        lines += [""] + [f"- {r.entry} FAIL: " + "; ".join(r.failed_checks) for r in fails] + [""]
    lines += ["Columns: completed / total requests; collateral = failed requests beyond one per overflow; makespan ="
              " first request sent to last ended; tok/s = tokens streamed / makespan; parks = pauses measured in "
              "upstream's log; recomputed = cells recomputed on resume; exact = streams equal to the no-overflow "
              "control (a terminated request's, if a prefix of it); verdict = the strategy's own expectations "
              "(base: none judged here)."]
    return "\n".join(lines) + "\n"


def svg(t: Table) -> str:
    """Makespan per strategy and workload, as horizontal bars (failed requests marked)."""
    rows = list(t.rows)
    top = max((r.makespan_s for r in rows), default=1.0) or 1.0
    h, w, label_w = 18, 720, 260
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h * len(rows) + 30}" font-size="11" '
           'font-family="sans-serif">']
    for i, r in enumerate(rows):
        y = i * h + 4
        bw = (w - label_w - 120) * r.makespan_s / top
        colour = "#c0392b" if r.completed < r.total else "#2e86c1" if r.parks else "#7f8c8d"
        out.append(f'<text x="0" y="{y + 12}">{r.workload} · {r.entry}</text>')
        out.append(f'<rect x="{label_w}" y="{y}" width="{bw:.1f}" height="{h - 4}" fill="{colour}"/>')
        out.append(f'<text x="{label_w + bw + 4:.1f}" y="{y + 12}">{r.makespan_s:.2f} s, {r.completed}/{r.total}'
                   f'{f", {r.parks} parks" if r.parks else ""}</text>')
    out.append(f'<text x="0" y="{h * len(rows) + 24}">makespan (grey: no park; blue: parked; red: requests '
               'failed)</text></svg>')
    return "\n".join(out)


def to_json(t: Table) -> dict:
    from dataclasses import asdict
    return {"schema": "patchkit-referee/1", "base_commit": t.base_commit, "layout": t.layout, "model": t.model,
            "seconds": t.seconds, "build_s": t.build_s, "rows": [asdict(r) for r in t.rows]}


def write(t: Table, out_dir: Path) -> dict[str, Path]:
    import html
    import json

    out_dir.mkdir(parents=True, exist_ok=True)
    md = markdown(t)
    paths = {"json": out_dir / "report.json", "md": out_dir / "report.md", "html": out_dir / "report.html"}
    paths["json"].write_text(json.dumps(to_json(t), indent=2))
    paths["md"].write_text(md)
    table_html = []
    for wl in dict.fromkeys(r.workload for r in t.rows):
        table_html.append(f"<h2>{html.escape(wl)}</h2><table><tr>" + "".join(f"<th>{h}</th>" for h, _ in COLUMNS)
                          + "</tr>" + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells(r)) + "</tr>"
                                              for r in t.rows if r.workload == wl) + "</table>")
    paths["html"].write_text(
        "<!doctype html><meta charset=utf-8><title>patchkit referee</title><style>body{font-family:sans-serif}"
        "td,th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}td:first-child{text-align:left}</style>"
        f"<h1>The referee</h1><p>base {t.base_commit[:12]}, layout {t.layout}, model {html.escape(t.model)}</p>"
        + svg(t) + "".join(table_html))
    return paths
