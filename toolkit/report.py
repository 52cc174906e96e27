"""Reports from a verify Result: report.json (for CI and pin), report.md, report.html.

Pure rendering: the data comes from verify/compare; nothing here decides a verdict.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import jinja2

from . import compare, coverage, measure, sensitivity
from .verify import Result, WorkloadResult
from .record import Run
from .workload import Workload

SCHEMA = 2  # 2: per-token arrival times, measured overflows, /slots generated counts
TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("toolkit", "templates"),
    undefined=jinja2.StrictUndefined,
    autoescape=jinja2.select_autoescape(["html"]),
    trim_blocks=True, lstrip_blocks=True,
)


def _outcome_json(o, pauses=()) -> dict:
    d = asdict(o)
    d["word"] = measure.word(o, pauses)  # the outcome, with "resumed" for a request that paused and finished
    d["pauses"] = [asdict(p) for p in pauses]
    d["tokens_received"] = len(o.tokens)
    d["tokens"] = list(o.tokens)
    d["token_t"] = [round(t, 5) for t in o.token_t]
    return d


def _run_json(r: Run, wl: Workload, policy: str = "largest") -> dict:
    return {
        "outcomes": [_outcome_json(o, ps.get(o.slot, ())) for ps in [measure.pauses(r)] for o in r.outcomes],
        "overflows": [{**asdict(e), "off": e.off, "full": e.full} for e in measure.overflows(r, wl, policy)],
        "events": [asdict(e) for e in r.events],
        "alive_after": r.alive_after, "followup_ok": r.followup_ok, "followup": r.followup, "exit_code": r.exit_code,
        "wall_s": round(r.wall, 3), "log": r.log, "attempts": r.attempts, "launch_spread_ms": r.launch_spread_ms,
        "log_bytes": r.log_bytes, "log_quiet_bytes": r.log_quiet,
        "sanitizer": list(r.sanitizer),
        "pool": r.pool,
        "occupancy": [[round(s.t, 4), s.slot, s.cells, s.processing, s.generated] for s in r.samples],
        # every start made before this one (for the workload's shape): kept, with its log and findings
        "earlier_starts": [_run_json(e, wl, policy) for e in r.earlier],
    }


def policy_text(res: Result) -> str:
    """patchkit's own series: the policy it was rendered with. Any other candidate: what its runs
    measurably did (whom each eviction or park took, by cells), never a default it was not asked."""
    if res.own:
        return res.policy
    took, most, fewest = 0, 0, 0
    for wr in res.results:
        for r in wr.candidate:
            for ev in measure.overflows(r, wr.workload, "largest"):
                if len(ev.terminated) != 1 or len(ev.in_play) < 2:
                    continue
                cells = {x.slot: x.cells for x in ev.in_play}
                took += 1
                most += cells[ev.terminated[0]] == max(cells.values())
                fewest += cells[ev.terminated[0]] == min(cells.values())
    parks = sum(len(v) for wr in res.results for r in wr.candidate for v in measure.pauses(r).values())
    parts = []
    if took:
        parts.append(f"its victim held the most cells in {most} of {took} evictions, the fewest in {fewest}")
    if parks:
        parts.append(f"{parks} park(s) measured")
    return "measured: " + ("; ".join(parts) if parts else "no eviction or park measured")


def check_counts(res: Result) -> dict[str, dict[str, int]]:
    """status -> {check name: how many times}, over every verdict of every workload and side."""
    out: dict[str, dict[str, int]] = {"pass": {}, "skip": {}, "fail": {}, "inconclusive": {}}
    for wr in res.results:
        for v in wr.verdicts:
            for c in v.checks:
                out[c.status][c.name] = out[c.status].get(c.name, 0) + 1
    return out


# the summary names at most this many shapes or pairs not reached; more are counted, and the
# shapes and pairs tables name each (one workload reaches 2 of 17 shapes: 15 names were a wall)
NAMED_MAX = 3


def _named(names, instead: str) -> str:
    """Up to NAMED_MAX names, else `instead` (where each is named)."""
    return ", ".join(names) if len(names) <= NAMED_MAX else instead


def _not_reached(gone: list[str], table: str) -> str:
    return _named(gone, f"{len(gone)}, each marked NOT REACHED in the {table} table")


def summary_line(res: Result) -> str:
    """`N checks passed, M skipped: <names>` (and the failures): a skip is shown, never counted as
    a pass silently."""
    counts = check_counts(res)

    def names(d: dict[str, int]) -> str:
        return ", ".join(f"{n} x{k}" if k > 1 else n for n, k in sorted(d.items()))
    line = f"{sum(counts['pass'].values())} checks passed, {sum(counts['skip'].values())} skipped"
    line += f": {names(counts['skip'])}" if counts["skip"] else ""
    if counts["fail"]:
        line += f"; {sum(counts['fail'].values())} failed: {names(counts['fail'])}"
    if counts["inconclusive"]:
        line += (f"; {sum(counts['inconclusive'].values())} inconclusive (a shape not reached or evidence "
                 f"missing, not against the candidate): {names(counts['inconclusive'])}")
    if res.not_run:
        line += (f"; --fail-fast stopped at the first failed workload: {len(res.not_run)} not run"
                 f" ({_named(res.not_run, 'report.json `not_run`')})")
    if res.coverage:
        gone = coverage.missed(res.coverage)
        line += (f"; shapes reached {len(res.coverage) - len(gone)}/{len(res.coverage)}"
                 + (f", not reached: {_not_reached(gone, 'shapes')}" if gone else ""))
        # with --repeat: a shape one lucky repeat reached is named, not counted as the suite's
        of = res.coverage[0].of
        some = [c for c in res.coverage if c.by and c.repeats < of]
        if of > 1 and not gone and not some:
            line += f" in each of {of} repeats"
        line += "".join(f"; {c.shape} in {c.repeats} of {of} repeats only" for c in some)
    reachable = [c for c in res.pairs if c.shape in coverage.PAIRS]
    if reachable:
        gone = coverage.missed(reachable)
        line += f"; pairs reached {len(reachable) - len(gone)}/{len(reachable)}"
        if res.family_pairs is not None and res.promised_pairs:   # a family's promise: the rest are listed
            kept = [c for c in reachable if c.shape in res.promised_pairs]
            lost = coverage.missed(kept)
            line += f" ({len(kept) - len(lost)}/{len(kept)} promised" + (f", not reached: {_not_reached(lost, 'pairs')})"
                                                                          if lost else ")")
        else:
            line += f", not reached: {_not_reached(gone, 'pairs')}" if gone else ""
        line += "".join(f"; pair argued unreachable yet reached: {c.shape}" for c in res.pairs
                        if c.shape not in coverage.PAIRS)
    return line


def to_json(res: Result) -> dict:
    out = {
        "schema": SCHEMA, "ok": res.ok, "outcome": res.outcome, "repo": res.repo,
        "summary": summary_line(res), "checks": check_counts(res),
        "coverage": [{"shape": c.shape, "reached_by": c.by, "repeats_reached": c.repeats, "repeats": c.of}
                     for c in res.coverage],
        "pairs": [{"pair": c.shape, "reached_by": c.by, "repeats_reached": c.repeats, "repeats": c.of,
                   "argued_reachable": c.shape in coverage.PAIRS, "judged": c.shape in res.promised_pairs}
                  for c in res.pairs],
        "base_commit": res.base_commit, "base_why": res.base_why, "candidate_commit": res.candidate_commit,
        "candidate": res.candidate_label, "candidate_source_commit": res.candidate_source,
        "policy": res.policy if res.own else None, "policy_measured": policy_text(res), "layout": res.layout,
        "promises": res.promises,
        "model_sha256": res.model_sha256,
        "sensitivity": {name: (r if isinstance(r, str) else sensitivity.to_json(r)) for name, r in res.sensitivity},
        "expect": res.expect, "expect_why": res.expect_why,
        "timings_s": {k: round(v, 2) for k, v in res.timings},
        "not_run": list(res.not_run),
        "workloads": {},
    }
    for wr in res.results:
        gp_b, gp_c = compare.goodput(list(wr.base)), compare.goodput(list(wr.candidate))
        out["workloads"][wr.workload.name] = {
            "ok": wr.ok,
            "model": {"name": wr.model, "sha256": wr.model_sha256},
            "description": wr.workload.description,
            "sizing": wr.workload.sizing.strip(),
            "expect": asdict(wr.workload.expect),
            "base": [_run_json(r, wr.workload, res.policy) for r in wr.base],
            "candidate": [_run_json(r, wr.workload, res.policy) for r in wr.candidate],
            "control": _run_json(wr.control, wr.workload.control()) if wr.control else None,
            "verdicts": [{"side": v.side, "run": v.run_index, "ok": v.ok,
                          "checks": [asdict(c) for c in v.checks]} for v in wr.verdicts],
            "goodput": {"base": asdict(gp_b) if gp_b else None, "candidate": asdict(gp_c) if gp_c else None},
        }
        if wr.upstream_test:
            out["workloads"][wr.workload.name]["upstream_test"] = upstream_test_json(wr.upstream_test)
    return out


def upstream_test_json(cmp) -> dict:
    """Upstream's unified-pool test on the same requests (upstream_unified.Comparison)."""
    return {"test": cmp.test, "case": asdict(cmp.case), "upstream_passes_both": cmp.upstream_passes_both,
            "patchkit_separates": cmp.patchkit_separates,
            "sides": [{"side": sd.side, "run": sd.run, "outcomes": list(sd.outcomes),
                       "upstream": asdict(sd.upstream), "patchkit_ok": sd.patchkit_ok,
                       "patchkit": [asdict(c) for c in sd.patchkit], "measured": sd.measured,
                       "as_candidate": [asdict(c) for c in sd.as_candidate]} for sd in cmp.sides]}


def _cell(o, pauses=()) -> str:
    cell = f"{measure.word(o, pauses)} {len(o.tokens)}/{o.n_predict}"
    if pauses:
        cell += " (paused at " + ", ".join(str(p.at_token) for p in pauses) + ")"
    return cell


def table_rows(wr: WorkloadResult, run: int = 0) -> list[list[str]]:
    """One row per slot: slot, prompt, base outcome, [candidate outcome], error (whose: error_cell)."""
    base = {o.slot: o for o in wr.base[run].outcomes} if wr.base else {}
    cand = {o.slot: o for o in wr.candidate[run].outcomes} if wr.candidate else {}
    b_ps = measure.pauses(wr.base[run]) if wr.base else {}
    c_ps = measure.pauses(wr.candidate[run]) if wr.candidate else {}
    rows = []
    for req in wr.workload.requests:
        b, c = base.get(req.slot), cand.get(req.slot)
        row = [str(req.slot), str(len(req.prompt)), _cell(b, b_ps.get(req.slot, ())) if b else "-"]
        if wr.candidate:
            row.append(_cell(c, c_ps.get(req.slot, ())) if c else "-")
        row.append(error_cell(b, c, bool(wr.candidate)))
        rows.append(row)
    return rows


def error_cell(b, c, has_candidate: bool = True) -> str:
    """The error column, saying whose error it is: a candidate that completed must not seem to
    carry the base's error."""
    eb = b.error if b and b.error else None
    ec = c.error if c and c.error else None
    if not has_candidate:
        return eb or ""
    if eb and eb == ec:
        return f"both: {eb}"
    return "; ".join(f"{side}: {e}" for side, e in (("base", eb), ("candidate", ec)) if e)


def headers(wr: WorkloadResult) -> list[str]:
    return ["slot", "prompt", "base"] + (["candidate"] if wr.candidate else []) + ["error"]


def text_table(res: Result) -> str:
    lines = []
    for wr in res.results:
        hdr, rows = headers(wr), table_rows(wr)
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(hdr)]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        lines.append(f"{wr.workload.name}: {'ok' if wr.ok else 'FAILED'}  ({len(wr.base)} run(s) per side)")
        lines.append("  " + fmt.format(*hdr))
        for r in rows:
            lines.append("  " + fmt.format(*r))
        for v in wr.verdicts:
            for c in v.checks:
                if c.status == "fail":
                    lines.append(f"  FAIL {v.side}#{v.run_index} {c.name}: {c.detail}")
        ev = [e for r in wr.candidate for e in measure.overflows(r, wr.workload, res.policy)]
        if ev:
            lines.append("  evictions (measured): " + "; ".join(
                ", ".join(f"slot {s} ({e.at(s).cells} cells)" for s in e.terminated) + f" at off={e.off}"
                for e in ev))
        if wr.upstream_test:
            ut = wr.upstream_test
            lines.append("  upstream's test_completion_unified rule on the same runs: " + "; ".join(
                f"{sd.side}#{sd.run} {'PASS' if sd.upstream.ok else 'FAIL'} ({sd.upstream.asserted} assertions)"
                for sd in ut.sides) + "; patchkit: base shows the bug (and fails as a fix), candidate passes: "
                + ("yes" if ut.patchkit_separates else "no"))
        lines.append("")
    if res.coverage:
        lines.append("shapes of the failure point (coverage):")
        w = max(len(c.shape) for c in res.coverage)
        lines += [f"  {c.shape:<{w}}  {c.where()}" for c in res.coverage]
        lines.append("")
    if res.pairs:
        lines.append("pairs of the failure point (the victim's undecoded entries x a survivor's place"
                     + ("; each park read as an overflow, its victim the parked slot" if res.expect == "preemption"
                        else "") + "):")
        w = max(len(c.shape) for c in res.pairs)
        lines += [f"  {c.shape:<{w}}  {c.where()}" + ("" if c.shape in coverage.PAIRS else "  (argued unreachable)")
                  + ("  (not promised: listed)" if res.family_pairs is not None and c.shape in coverage.PAIRS
                     and c.shape not in res.promised_pairs else "")
                  for c in res.pairs]
        lines.append("")
    lines += [sensitivity.line(r, name) for name, r in res.sensitivity]
    if res.candidate_commit:
        lines.append("promises judged beyond the property: " + (res.promises or "none (a foreign candidate that "
                     "declares none: --promises FILE gives it the checks of the series that promise the same)"))
    lines.append(summary_line(res))
    return "\n".join(lines)


def write(res: Result, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    data = to_json(res)
    paths = {"json": out_dir / "report.json", "md": out_dir / "report.md", "html": out_dir / "report.html"}
    paths["json"].write_text(json.dumps(data, indent=2) + "\n")
    ctx = {"res": res, "data": data, "headers": headers, "rows": table_rows, "goodput": compare.goodput,
           "policy": policy_text(res),
           "timeline": timeline_svg,
           "sensitivity_lines": [sensitivity.line(r, name) for name, r in res.sensitivity]}
    paths["md"].write_text(TEMPLATES.get_template("report.md.j2").render(**ctx))
    paths["html"].write_text(TEMPLATES.get_template("report.html.j2").render(**ctx))
    return paths


def _step_of(table: list[dict[int, int]], ev: measure.Overflow) -> int:
    """Index of the step whose cells (when it began) are the overflow's: its failing step."""
    return next((k for k, st in enumerate(table) if all(
        st.get(s.slot) == s.cells - (1 if s.position < ev.off else 0) for s in ev.in_play)), len(table))


def timeline_svg(run: Run, wl: Workload, title: str = "") -> str:
    """Per slot, the KV cells it holds (prompt + tokens sampled) over server steps, from the
    per-token record aligned by the measured step offsets (measure.py), so arrival jitter does
    not bend the lines. Step 0 is the (first) overflow; each measured overflow is marked with
    its victim, each slot's end with how it ended. matplotlib (Agg) renders it to inline SVG."""
    import io

    import matplotlib

    fig = timeline_figure(run, wl, title)
    if fig is None:
        return "<p>no tokens were recorded in this run</p>"
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text stays text: searchable, selectable
        fig.savefig(buf, format="svg")
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]


def overflow_label(ev: measure.Overflow, width: int = 60) -> str:
    """The overflow marker's text, wrapped at `width` characters: the base's overflow terminates
    every slot in play, and eight "slot N (C cells)" on one line ran off the chart."""
    import textwrap

    who = ", ".join(f"slot {s} ({ev.at(s).cells} cells)" for s in ev.terminated)
    return textwrap.fill(f"overflow at off {ev.off}: {who} terminated", width, break_on_hyphens=False)


def timeline_figure(run: Run, wl: Workload, title: str = ""):
    """The figure timeline_svg renders (None without tokens)."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    outs = [o for o in run.outcomes if o.tokens]
    if not outs:
        return None
    evs = measure.overflows(run, wl)
    fig = Figure(figsize=(8, 3.4), dpi=96)
    ax = fig.add_subplot()
    ends = {"completed": ("o", "#2a7d2a", "completed"), "errored": ("X", "#c00000", "errored"),
            "truncated": ("^", "#d08000", "truncated")}
    series: dict[int, list[tuple[int, int]]] = {}
    table = measure.steps(run)
    if table:
        # upstream's log: every step's cells per slot, exact; step 0 is the first overflow's step
        fail = _step_of(table, evs[0]) if evs else len(table)
        for k, st in enumerate(table):
            for slot, c in st.items():
                series.setdefault(slot, []).append((k - fail, c))
    else:
        # the client's tokens, aligned by the measured step offsets
        ref = next((o for o in run.outcomes if evs and o.slot == evs[0].terminated[0]), outs[0])
        shift = {o.slot: 0 if o is ref else -measure.offset(ref, o, run.samples).steps for o in outs}
        zero = evs[0].at(ref.slot).generated if evs else 0
        for o in outs:
            series[o.slot] = [(k + shift[o.slot] - zero, o.prompt_tokens + k - 1) for k in range(1, len(o.tokens) + 1)]
    total: dict[int, int] = {}
    by_slot = {o.slot: o for o in run.outcomes}
    for slot, pts in sorted(series.items()):
        o = by_slot.get(slot)
        if o is None:
            continue
        for x, c in pts:
            total[x] = total.get(x, 0) + c
        ax.plot([x for x, _ in pts], [c for _, c in pts], lw=1.4,
                label=f"slot {slot} (prompt {o.prompt_tokens}): {o.outcome}")
        marker, colour, _ = ends.get(o.outcome, ("s", "#555555", o.outcome))
        ax.plot(pts[-1][0], pts[-1][1], ls="none", marker=marker, color=colour, ms=9, mec="black", mew=0.8, zorder=5)
    xs = sorted(total)
    # the window around the overflow: the last 60 steps before it and everything after
    lo, hi = (max(xs[0], -60) - 2, xs[-1] + 3) if evs else (xs[0], xs[-1])
    for ev in evs:
        if table:
            x = _step_of(table, ev) - fail
        else:
            x = ev.at(ev.terminated[0]).generated - zero if ev.at(ev.terminated[0]) else 0
        ax.axvline(x, color="#c00000", ls="--", lw=1)
        # the text on the side of the marker with more room, so it stays inside the chart
        left = x - lo >= hi - x
        ax.annotate(overflow_label(ev), (x, run.pool), xytext=(-4 if left else 4, -4),
                    textcoords="offset points", ha="right" if left else "left", va="top", fontsize=8,
                    color="#c00000")
    ax.plot(xs, [total[x] for x in xs], color="black", lw=1, label="all slots together")
    ax.axhline(run.pool, color="#888888", lw=0.8, ls=":")
    ax.annotate(f"pool: {run.pool} cells", (xs[-1], run.pool), xytext=(0, 3), textcoords="offset points",
                fontsize=7, ha="right")
    if evs:
        ax.set_xlim(lo, hi)
    ax.set_xlabel("server step (0 = the step where the pool ran out)" if evs else "server step")
    ax.set_ylabel("KV cells held (prompt + tokens)")
    ax.set_ylim(0, run.pool * 1.08)
    ax.set_title(title or run.workload, fontsize=9)
    ax.legend(fontsize=7, loc="center left", title="end: o completed, X errored, ^ truncated", title_fontsize=7)
    ax.grid(alpha=0.3)
    fig.subplots_adjust(left=0.09, right=0.985, bottom=0.15, top=0.91)  # tight_layout costs a draw per chart
    return fig
