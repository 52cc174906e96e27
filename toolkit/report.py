"""Reports from a verify Result: report.json (for CI and pin), report.md, report.html.

Pure rendering: the data comes from verify/compare; nothing here decides a verdict.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import jinja2

from . import compare, measure
from .verify import Result, WorkloadResult
from .record import Run
from .workload import Workload

SCHEMA = 1
TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("toolkit", "templates"),
    undefined=jinja2.StrictUndefined,
    autoescape=jinja2.select_autoescape(["html"]),
    trim_blocks=True, lstrip_blocks=True,
)


def _outcome_json(o) -> dict:
    d = asdict(o)
    d["tokens_received"] = len(o.tokens)
    d["tokens"] = list(o.tokens)
    return d


def _run_json(r: Run) -> dict:
    return {
        "outcomes": [_outcome_json(o) for o in r.outcomes],
        "events": [asdict(e) for e in r.events],
        "alive_after": r.alive_after, "followup_ok": r.followup_ok, "exit_code": r.exit_code,
        "wall_s": round(r.wall, 3), "log": r.log, "attempts": r.attempts, "launch_spread_ms": r.launch_spread_ms,
        "sanitizer": list(r.sanitizer),
        "occupancy": [[round(s.t, 3), s.slot, s.cells, s.processing] for s in r.samples],
    }


def to_json(res: Result) -> dict:
    out = {
        "schema": SCHEMA, "ok": res.ok, "repo": res.repo,
        "base_commit": res.base_commit, "candidate_commit": res.candidate_commit,
        "candidate": res.candidate_label, "candidate_source_commit": res.candidate_source, "policy": res.policy, "layout": res.layout,
        "model_sha256": res.model_sha256,
        "timings_s": {k: round(v, 2) for k, v in res.timings},
        "workloads": {},
    }
    for wr in res.results:
        gp_b, gp_c = compare.goodput(list(wr.base)), compare.goodput(list(wr.candidate))
        out["workloads"][wr.workload.name] = {
            "ok": wr.ok,
            "description": wr.workload.description,
            "sizing": wr.workload.sizing.strip(),
            "expect": asdict(wr.workload.expect),
            "base": [_run_json(r) for r in wr.base],
            "candidate": [_run_json(r) for r in wr.candidate],
            "control": _run_json(wr.control) if wr.control else None,
            "verdicts": [{"side": v.side, "run": v.run_index, "ok": v.ok,
                          "checks": [asdict(c) for c in v.checks]} for v in wr.verdicts],
            "goodput": {"base": asdict(gp_b) if gp_b else None, "candidate": asdict(gp_c) if gp_c else None},
        }
    return out


def _cell(o) -> str:
    return f"{o.outcome} {len(o.tokens)}/{o.n_predict}"


def table_rows(wr: WorkloadResult, run: int = 0) -> list[list[str]]:
    """One row per slot: slot, prompt, base outcome, [candidate outcome], error."""
    base = {o.slot: o for o in wr.base[run].outcomes} if wr.base else {}
    cand = {o.slot: o for o in wr.candidate[run].outcomes} if wr.candidate else {}
    rows = []
    for req in wr.workload.requests:
        b, c = base.get(req.slot), cand.get(req.slot)
        row = [str(req.slot), str(len(req.prompt)), _cell(b) if b else "-"]
        if wr.candidate:
            row.append(_cell(c) if c else "-")
        err = (c.error if c and c.error else None) or (b.error if b and b.error else None) or ""
        row.append(err)
        rows.append(row)
    return rows


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
        ev = [e for r in wr.candidate for e in r.events if e.kind == "evict"]
        if ev:
            lines.append("  evictions: " + "; ".join(f"slot {e.victim} ({e.cells} cells) at off={e.off}" for e in ev))
        lines.append("")
    return "\n".join(lines)


def write(res: Result, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    data = to_json(res)
    paths = {"json": out_dir / "report.json", "md": out_dir / "report.md", "html": out_dir / "report.html"}
    paths["json"].write_text(json.dumps(data, indent=2) + "\n")
    ctx = {"res": res, "data": data, "headers": headers, "rows": table_rows, "goodput": compare.goodput,
           "timeline": timeline_svg}
    paths["md"].write_text(TEMPLATES.get_template("report.md.j2").render(**ctx))
    paths["html"].write_text(TEMPLATES.get_template("report.html.j2").render(**ctx))
    return paths


def timeline_svg(run: Run, wl: Workload, title: str = "") -> str:
    """Per slot, the KV cells it holds (prompt + tokens streamed to it) against the time each token
    arrived, from the per-token record: the window is the generation, where the overflow happens.
    Measured overflows are marked with the victim; each slot's end is marked by how it ended.
    matplotlib (Agg) renders it to an inline SVG."""
    import io

    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    outs = [o for o in run.outcomes if o.token_t]
    if not outs:
        return "<p>no tokens were streamed in this run</p>"
    fig = Figure(figsize=(8, 3.4), dpi=96)
    ax = fig.add_subplot()
    ends = {"completed": ("o", "#2a7d2a"), "errored": ("X", "#c00000"), "truncated": ("^", "#d08000")}
    for o in outs:
        ts = [1000 * t for t in o.token_t]
        cells = [o.prompt_tokens + k for k in range(1, len(ts) + 1)]
        line, = ax.plot(ts, cells, lw=1.4, label=f"slot {o.slot} (prompt {o.prompt_tokens})")
        marker, colour = ends.get(o.outcome, ("s", "#555555"))
        ax.plot([1000 * max(o.t_end, ts[-1]) if o.outcome == "errored" else ts[-1]], [cells[-1]], marker=marker,
                color=colour, ms=8, mec="black", mew=0.6, zorder=5)
    for ev in measure.overflows(run, wl):
        x = 1000 * ev.t
        ax.axvline(x, color="#c00000", ls="--", lw=1)
        who = ", ".join(f"slot {s} ({ev.at(s).cells} cells)" for s in ev.terminated)
        ax.annotate(f"overflow at off {ev.off}: {who} terminated", (x, ax.get_ylim()[1]), xytext=(-4, -12),
                    textcoords="offset points", ha="right", fontsize=8, color="#c00000")
    lo = min(1000 * o.token_t[0] for o in outs)
    hi = max(1000 * o.t_end for o in outs)
    ax.set_xlim(lo - 0.02 * (hi - lo), hi + 0.02 * (hi - lo))
    ax.set_xlabel("time since the requests were released (ms)")
    ax.set_ylabel("KV cells held (prompt + tokens)")
    ax.axhline(run.pool, color="#888888", lw=0.8, ls=":")
    ax.set_title(title or f"{run.workload}: cells per slot; end: o completed, X errored, ^ truncated", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text stays text: searchable, selectable
        fig.savefig(buf, format="svg")
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]
