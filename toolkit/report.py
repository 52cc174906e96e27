"""Reports from a verify Result: report.json (for CI and pin), report.md, report.html.

Pure rendering: the data comes from verify/compare; nothing here decides a verdict.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import jinja2

from . import compare
from .verify import Result, WorkloadResult
from .workload import Run

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


def timeline_svg(run: Run, width: int = 640, height: int = 220) -> str:
    """Per-slot KV cells over time as an inline SVG polyline chart; evictions marked."""
    if not run.samples:
        return "<p>no occupancy samples</p>"
    t_max = max(s.t for s in run.samples) or 1.0
    c_max = max(max(s.cells for s in run.samples), 1)
    colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
    by_slot: dict[int, list] = {}
    for s in run.samples:
        by_slot.setdefault(s.slot, []).append(s)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 20}" '
             f'viewBox="0 0 {width} {height + 20}">',
             f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fafafa" stroke="#ccc"/>']
    for slot, pts in sorted(by_slot.items()):
        xy = " ".join(f"{s.t / t_max * (width - 10) + 5:.1f},{height - s.cells / c_max * (height - 10) - 5:.1f}"
                      for s in pts)
        col = colours[slot % len(colours)]
        parts.append(f'<polyline fill="none" stroke="{col}" stroke-width="1.5" points="{xy}"/>')
        parts.append(f'<text x="{8 + 60 * slot}" y="{height + 15}" fill="{col}" font-size="11">slot {slot}</text>')
    for o in run.outcomes:
        if o.outcome == "errored":
            x = o.t_end / t_max * (width - 10) + 5
            parts.append(f'<line x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{height}" stroke="#d00" '
                         f'stroke-dasharray="4 3"/><text x="{x + 3:.1f}" y="12" fill="#d00" font-size="11">'
                         f'slot {o.slot} evicted/errored</text>')
    parts.append(f'<text x="{width - 150}" y="{height + 15}" font-size="11">max {c_max} cells, {t_max:.2f} s</text>')
    parts.append("</svg>")
    return "\n".join(parts)
