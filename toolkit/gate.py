"""The pin gate: judge a pr-set.json change by the nightlies it produces (`patchkit ci`).

Before = the fork's nightly mix of the old pr-set.json, after = the mix of the new one (mix.py:
base + every pin in listed order, merged as the nightly merges them). Both are built and run on
the suite; the after side must not regress from the before side on any request, and must meet
the eviction expectations whenever it measurably evicts (verify.expectations). When it fails,
the responsible pin is found by building the mix up to each added or moved pin and judging it
against the mix just before that pin. An after mix that does not merge fails with the
nightly's own message.

The workflow (ci/pin-gate.yml) only fetches code and calls `patchkit ci`; it fans the suite
out over a job matrix (`plan`), and a last job merges the shards' gate.json files (`merge`).
Everything a verdict rests on is in gate.json, so a merged report judges exactly what the
shards judged.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import git

from . import build as build_mod
from . import mix as mix_mod
from . import report, workload
from . import verify as pipeline
from .errors import BuildError, PatchError, ReportError
from .mix import Entry, Mix

SCHEMA = 1


@dataclass(frozen=True)
class Blame:
    """One attribution step: the mix up to `entry`, judged against the mix just before it."""
    entry: Entry
    ok: bool
    failed: tuple[str, ...]


@dataclass(frozen=True)
class GateResult:
    before: Mix
    after: Mix
    changed: tuple[Entry, ...]
    result: pipeline.Result | None       # before vs after; None when there is nothing to run
    blame: tuple[Blame, ...]
    culprits: tuple[Entry, ...]
    note: str
    report_dir: Path
    sanitize: tuple[str, ...] = ()
    builds: bool = True                  # False: the after nightly does not compile
    upstream: dict | None = None         # llama.cpp's own server tests, before vs after (upstream.to_json)

    @property
    def ok(self) -> bool:
        return (self.after.ok and self.builds and (self.result is None or self.result.ok)
                and (self.upstream is None or self.upstream["ok"]))


def failed_checks(res: pipeline.Result) -> list[str]:
    return [f"{v.workload} {'after' if v.side == 'candidate' else 'before'}#{v.run_index} {c.name}: {c.detail}"
            for r in res.results for v in r.verdicts for c in v.checks if c.status == "fail"]


def _prefix(m: Mix, entry: Entry) -> tuple[str, str]:
    """(the mix just before `entry`, the mix up to and including it)."""
    k = next(i for i, s in enumerate(m.steps) if s.entry == entry)
    return (m.steps[k - 1].commit if k else m.base), m.steps[k].commit


def _unbuildable(repo: git.Repo, after: Mix, merged: list[Entry], opts, ui) -> tuple[Entry | None, str] | None:
    """None when the after mix builds; else (the first added or moved pin whose mix does not
    build, the compiler's first error). Built prefix by prefix only after a failure."""
    try:
        build_mod.build(repo, after.commit, opts, ui.progress)
        return None
    except BuildError as e:
        why = str(e)
    if len(merged) <= 1:
        return (merged[0] if merged else None), why
    for e in merged:
        try:
            build_mod.build(repo, _prefix(after, e)[1], opts, ui.progress)
        except BuildError as err:
            return e, str(err)
    return None, why


def gate(repo: git.Repo, *, base: str, old: list[Entry], new: list[Entry], out_dir: Path, ui,
         states: dict[str, mix_mod.PrState] | None = None, workloads: list[str] | None = None, repeat: int = 1,
         expect: str = "auto", opts: build_mod.Options = build_mod.Options(),
         upstream_tests: tuple[str, ...] = ()) -> GateResult:
    """`workloads`: None = the suite, [] = none (a shard of upstream's tests only).
    `upstream_tests`: also run llama.cpp's own server tests (upstream.py) on both nightlies; a
    test passing before and failing after fails the gate, and names the pin that breaks it."""
    ui.say("==> nightly mixes")
    before = mix_mod.build_mix(repo, base, old, states, ui.say)
    if not before.ok:
        raise PatchError(f"the current pr-set.json (before the change) does not mix: {before.failure}",
                         hint="Fix the fork's nightly first; the gate compares against it.")
    after = mix_mod.build_mix(repo, base, new, states, ui.say)
    changed = tuple(mix_mod.changed(old, new))
    ui.say(f"before: {before.describe()} = {before.commit[:12]}")
    ui.say(f"after:  {after.describe()}" + (f" = {after.commit[:12]}" if after.ok else ": DOES NOT MIX"))
    for w in before.warnings + after.warnings:
        ui.say(f"warning: {w}")
    kw = dict(before=before, after=after, changed=changed, report_dir=out_dir, sanitize=opts.sanitize)
    if not after.ok:
        return GateResult(result=None, blame=(), culprits=(after.failed_entry,), note=after.failure, **kw)
    if repo.commit(before.commit).tree == repo.commit(after.commit).tree:
        return GateResult(result=None, blame=(), culprits=(), note="the after mix has the same tree as the "
                          "before mix: nothing to build or run", **kw)
    wls = [workload.load(w) for w in (pipeline.SUITE if workloads is None else workloads)]
    merged = [e for e in changed if any(s.entry == e and s.action == "merged" for s in after.steps)]
    with ui.step("build the nightlies"):
        try:
            build_mod.build(repo, before.commit, opts, ui.progress)
        except BuildError as e:
            raise BuildError(f"the current nightly (before the change) does not build: {e}", log=e.log)
        broken = _unbuildable(repo, after, merged, opts, ui)
    if broken:
        entry, why = broken
        return GateResult(result=None, blame=(), culprits=(entry,) if entry else (),
                          note=f"the after nightly does not build: {why}", **kw, builds=False)
    up = _upstream(repo, before, after, merged, upstream_tests, repeat, out_dir, opts, ui) if upstream_tests else None
    if not wls:
        culprits = tuple(up[1]) if up else ()
        return GateResult(result=None, blame=(), culprits=culprits, note="", upstream=up[0] if up else None, **kw)
    with ui.step("before vs after"):
        res = pipeline.run_suite(repo, before.commit, after.commit, wls, repeat=repeat, work_dir=out_dir / "logs",
                                 opts=opts, candidate_label=f"after: {after.describe()}",
                                 candidate_source=changed[0].pin.sha if len(changed) == 1 else None,
                                 expect=expect, base_reference=True, sides=("before", "after"), say=ui.say,
                                 progress=ui.progress)
    report.write(res, out_dir)
    blame: list[Blame] = []
    culprits: tuple[Entry, ...] = ()
    if not res.ok and len(merged) == 1:
        culprits = (merged[0],)
    elif not res.ok and merged:
        failing = [w for w in wls if not next(r for r in res.results if r.workload.name == w.name).ok]
        for e in merged:
            prev, upto = _prefix(after, e)
            with ui.step(f"attribution: the mix up to {e.name} vs the mix before it"):
                r = pipeline.run_suite(repo, prev, upto, failing, repeat=repeat,
                                       work_dir=out_dir / "attribution" / f"{e.pin.owner}-{e.pin.pr}",
                                       opts=opts, candidate_label=f"up to {e.name}", candidate_source=e.pin.sha,
                                       expect=expect, base_reference=True, sides=("before", "after"), say=ui.say,
                                       progress=ui.progress,
                                       fail_fast=True)   # whether the prefix fails: its first failure names it
            blame.append(Blame(e, r.ok, tuple(failed_checks(r))))
            if not r.ok:
                culprits = (e,)
                break
    if up and not up[0]["ok"] and not culprits:
        culprits = tuple(up[1])
    note = ""
    if not res.ok and not culprits:
        removed = [e.name for e in old if e.pin.url not in {n.pin.url for n in new}]
        note = ("no single added or moved pin fails against the mix before it: the failure needs the pins "
                "together" if merged else "no pin was added or moved: the change removes or reorders pins"
                + (f" (removed: {', '.join(removed)})" if removed else ""))
    return GateResult(result=res, blame=tuple(blame), culprits=culprits, note=note, upstream=up[0] if up else None,
                      **kw)


def _upstream(repo, before: Mix, after: Mix, merged: list[Entry], tests, repeat: int, out_dir: Path, opts,
              ui) -> tuple[dict, list[Entry]]:
    """Upstream's server tests, the before nightly vs the after one: (upstream.json, culprits).
    With several added pins, each regressed test is run again on the mix up to each pin against
    the mix before it, and the first pin where one regresses is named."""
    from . import upstream

    with ui.step("llama.cpp server tests: before vs after"):
        r = upstream.run(repo, before.commit, after.commit, candidate_label=f"after: {after.describe()}",
                         tests=tests, repeat=repeat, out_dir=out_dir / "upstream", opts=opts, say=ui.say,
                         progress=ui.progress)
    upstream.write(r, out_dir / "upstream")
    data = upstream.to_json(r)
    if r.ok or not merged:
        return data, []
    if len(merged) == 1:
        return data, merged
    # junit ids (unit.test_tokenize::name) as pytest node ids (unit/test_tokenize.py::name)
    ids = [mod.replace(".", "/") + ".py::" + name for mod, _, name in
           (x.id.partition("::") for x in r.comparison.regressions)]
    for e in merged:
        prev, upto = _prefix(after, e)
        with ui.step(f"attribution (server tests): the mix up to {e.name} vs the mix before it"):
            a = upstream.run(repo, prev, upto, tests=ids, repeat=repeat, opts=opts, say=ui.say, progress=ui.progress,
                             out_dir=out_dir / "upstream" / f"attribution-{e.pin.owner}-{e.pin.pr}")
        if not a.ok:
            return data, [e]
    return data, []


# ---------------------------------------------------------------- gate.json: what shards share

def _mix_json(m: Mix) -> dict:
    return {"base": m.base, "commit": m.commit if m.ok else None, "failure": m.failure,
            "steps": [{"pin": s.entry.name, "url": s.entry.pin.url, "required": s.entry.required,
                       "action": s.action, "commit": s.commit, "note": s.note} for s in m.steps]}


def _side(runs) -> list[list]:
    return [[[o.slot, o.outcome, len(o.tokens), o.n_predict, o.error or ""] for o in r.outcomes] for r in runs]


def to_json(g: GateResult, shard: str = "") -> dict:
    res = g.result
    workloads = {}
    if res:
        for wr in res.results:
            key = wr.workload.name + (f" [{','.join(g.sanitize)}]" if g.sanitize else "")
            workloads[key] = {
                "ok": wr.ok, "prompts": [len(r.prompt) for r in wr.workload.requests],
                "before": _side(wr.base), "after": _side(wr.candidate),
                "failed": [f for f in failed_checks(res) if f.startswith(wr.workload.name + " ")],
            }
    return {
        "schema": SCHEMA, "ok": g.ok, "builds": g.builds, "shards": [shard or "all"],
        "before": _mix_json(g.before), "after": _mix_json(g.after),
        "changed": [{"pin": e.name, "url": e.pin.url} for e in g.changed],
        "expect": res.expect if res else None, "expect_why": res.expect_why if res else None,
        "culprits": [{"pin": e.name, "url": e.pin.url} for e in g.culprits],
        "blame": [{"pin": b.entry.name, "ok": b.ok, "failed": list(b.failed)} for b in g.blame],
        "note": g.note, "workloads": workloads, "upstream": g.upstream,
    }


def merge(datas: list[dict]) -> dict:
    """One gate.json from the shards' (same mixes; workloads and runs united; any failing shard fails)."""
    if not datas:
        raise ReportError("no gate.json to merge.")
    first = datas[0]
    for d in datas[1:]:
        for side in ("before", "after"):
            if (d[side]["base"], d[side]["commit"]) != (first[side]["base"], first[side]["commit"]):
                raise ReportError(f"shards judged different {side} mixes ({first[side]['commit']} vs "
                                  f"{d[side]['commit']}); were they run on the same pr-set and base?")
    out = {k: first[k] for k in ("schema", "before", "after", "changed", "expect", "expect_why")}
    out["shards"] = [s for d in datas for s in d["shards"]]
    out["ok"] = all(d["ok"] for d in datas)
    out["builds"] = all(d["builds"] for d in datas)
    pins = [s["pin"] for s in first["after"]["steps"]]
    culprits = {c["pin"]: c for d in datas for c in d["culprits"]}
    out["culprits"] = sorted(culprits.values(), key=lambda c: pins.index(c["pin"]) if c["pin"] in pins else -1)
    out["blame"] = [b for d in datas for b in d["blame"]]
    out["note"] = "; ".join(dict.fromkeys(d["note"] for d in datas if d["note"]))
    whys = {d["expect"] for d in datas if d["expect"]}
    if len(whys) > 1:
        out["expect"] = "/".join(sorted(whys))
        out["expect_why"] = "; ".join(f"{d['shards'][0]}: {d['expect_why']}" for d in datas if d["expect"])
    wls: dict[str, dict] = {}
    for d in datas:
        for name, w in d["workloads"].items():
            m = wls.setdefault(name, {"ok": True, "prompts": w["prompts"], "before": [], "after": [], "failed": []})
            m["ok"] = m["ok"] and w["ok"]
            for k in ("before", "after", "failed"):
                m[k] += w[k]
    out["workloads"] = wls
    ups = [d["upstream"] for d in datas if d.get("upstream")]
    out["upstream"] = ups[0] if len(ups) == 1 else ({"ok": all(u["ok"] for u in ups), "shards": ups} if ups else None)
    return out


def summary_md(d: dict) -> str:
    """The step summary: verdict, the two nightlies, the responsible pin, the before/after table."""
    lines = [f"## patchkit pin gate: {'PASS' if d['ok'] else 'FAIL'}", ""]

    def mixline(m):
        merged = [s["pin"] for s in m["steps"] if s["action"] == "merged"]
        return f"base `{m['base'][:12]}`" + "".join(f" + {p}" for p in merged) + (
            f" = `{m['commit'][:12]}`" if m["commit"] else " (does not mix)")
    lines += [f"- **before** (the current nightly): {mixline(d['before'])}",
              f"- **after** (the nightly with this change): {mixline(d['after'])}",
              "- **added or moved pins**: " + (", ".join(f"{c['pin']} at `{c['url'].rsplit('/', 1)[-1][:12]}`"
                                                        for c in d["changed"]) or "none")]
    if d["expect"]:
        lines.append(f"- **expectations**: {d['expect']} ({d['expect_why']})")
    if d["culprits"]:
        lines.append("- **responsible pin**: " + ", ".join(f"{c['pin']} ({c['url']})" for c in d["culprits"]))
    if d["after"]["failure"]:
        lines.append(f"- **the nightly would stop**: {d['after']['failure']}")
    if d["note"]:
        lines.append(f"- {d['note']}")
    for m in ("before", "after"):
        for s in d[m]["steps"]:
            if s["note"]:
                lines.append(f"- warning ({m}): {s['pin']}: {s['note']}")
    lines.append(f"- shards: {', '.join(d['shards'])}")
    for u in ([d["upstream"]] if d.get("upstream") and "counts" in d["upstream"] else
              (d.get("upstream") or {}).get("shards", [])):
        c = u["counts"]
        lines.append(f"- **llama.cpp server tests** ({', '.join(u['tests'])}): {'PASS' if u['ok'] else 'FAIL'}; "
                     f"run {c['run']}, passed before {c['passed_before']}, passed after {c['passed_after']}, "
                     f"regressions {c['regressions']}, gained {c['gained']}, flaky {c['flaky']}, not run "
                     f"{c['not_run']}" + (" (" + "; ".join(f"{n} {why}" for why, n in u["not_run_reasons"].items())
                                          + ")" if u["not_run_reasons"] else ""))
        for r in u["regressions"]:
            lines.append(f"  - REGRESSION {r['id']}: {r['message'][:300]}")
    for b in d["blame"]:
        lines.append(f"- attribution: mix up to {b['pin']} vs before it: {'ok' if b['ok'] else 'FAIL'}"
                     + (f" ({b['failed'][0]})" if b["failed"] else ""))
    if d["workloads"]:
        lines += ["", "| workload | run | slot | prompt | before | after | error |", "|---|---|---|---|---|---|---|"]
        for name, w in d["workloads"].items():
            for k, (b, a) in enumerate(zip(w["before"], w["after"])):
                for (slot, bo, bn, npred, berr), (_, ao, an, _, aerr) in zip(b, a):
                    lines.append(f"| {name}{'' if w['ok'] else ' **FAIL**'} | {k} | {slot} | "
                                 f"{w['prompts'][slot] if slot < len(w['prompts']) else '-'} | "
                                 f"{bo} {bn}/{npred} | {ao} {an}/{npred} | {_errors(berr, aerr)} |")
        fails = [f for w in d["workloads"].values() for f in w["failed"]]
        if fails:
            lines += ["", "Failing checks:", ""] + [f"- {f}" for f in fails]
    return "\n".join(lines) + "\n"


def _errors(before: str, after: str) -> str:
    if before == after:
        return after
    return "; ".join(f"{side}: {e}" for side, e in (("before", before), ("after", after)) if e)


def write(data: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gate.json").write_text(json.dumps(data, indent=2) + "\n")
    (out_dir / "summary.md").write_text(summary_md(data))
    return out_dir / "gate.json"


# ---------------------------------------------------------------- the job matrix

# The `--workload` of a shard that runs no workload (the upstream-tests shard).
NO_WORKLOADS = "none"


def plan(*, base: str, old_text: str | None, new_text: str, workloads: list[str] | None, repeat: int,
         sanitize: str | None, entries: list[Entry] = (), upstream_tests: tuple[str, ...] = ()) -> dict:
    """A GitHub Actions matrix: one shard per workload x repeat, plus one sanitizer shard.
    `key` names the mix (base + both pr-sets) for the caches; `pins` (old and new, validated)
    are what the jobs fetch."""
    key = hashlib.sha256(json.dumps([base, old_text or "", new_text]).encode()).hexdigest()[:16]
    include = [{"name": f"{w} #{k + 1}", "workloads": w, "sanitize": "", "upstream": ""}
               for w in (workloads or pipeline.SUITE) for k in range(repeat)]
    if sanitize:
        include.append({"name": f"sanitize {sanitize}", "workloads": ",".join(workloads or pipeline.SUITE),
                        "sanitize": sanitize, "upstream": ""})
    if upstream_tests:  # llama.cpp's own server tests: one shard, no workloads
        include.append({"name": f"upstream tests {','.join(upstream_tests)}", "workloads": NO_WORKLOADS,
                        "sanitize": "", "upstream": ",".join(upstream_tests)})
    pins = {e.pin.url: {"owner": e.pin.owner, "pr": e.pin.pr, "sha": e.pin.sha} for e in entries}
    return {"key": key, "include": include, "pins": list(pins.values())}
