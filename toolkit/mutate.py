"""The mutation campaign: a check is only as strong as the wrong patches it kills.

Every mutant of patches/<name>/patch.toml ([variants.*]: one structural switch of the templates
flipped, patch.RIGHT) is rendered on the base as commit objects, built (one TU on the shared
workspace), and judged exactly as a candidate is: the static checks of the patched TU, the C++
property harness of the batch surgery, and the workload suite against the same base. A mutant is
killed when any check fails, and each failing check is kept with its reason; ALIVE otherwise.
The base side's runs and controls are made once per campaign and shared (verify.run_suite's
`reuse`), so a mutant costs one TU compile plus its candidate runs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import git

from . import apply as apply_mod
from . import build as build_mod
from . import check as check_mod
from . import patch as patch_mod
from . import verify as verify_mod
from .errors import BuildError, LayoutError, PatchError
from .workload import Workload

# Workloads the campaign adds to the default suite: each separates what a wrong patch could
# confuse (docs/DESIGN.md, "Verdict strength").
# The preemption patches' broken variants: the baseline overflow, and the same with a sampler that
# carries state (a repetition penalty), which greedy sampling alone does not.
PREEMPTION_WORKLOADS = ["overflow-4", "preempt-penalty-4"]
EXTRA: list[str] = []  # the separating workloads (family models) are in verify.SUITE now


@dataclass(frozen=True)
class Kill:
    check: str
    where: str      # static | property | build | "<workload> run k"
    reason: str
    run: int = 0    # the repetition (1..repeat) of a workload kill; 0: a deterministic one (static, property)


@dataclass(frozen=True)
class MutantResult:
    name: str
    cls: str
    what: str
    killer: str                 # the check meant to kill it (patch.toml); "equivalent" when claimed so
    layout: str
    status: str                 # killed | ALIVE | not-applicable
    kills: tuple[Kill, ...]
    seconds: float
    note: str = ""
    repeat: int = 1

    @property
    def runs_killed(self) -> int:
        """Of the `repeat` repetitions, how many killed it: a deterministic kill counts for all."""
        if any(k.run == 0 for k in self.kills):
            return self.repeat
        return len({k.run for k in self.kills})

    @property
    def by_killer(self) -> bool:
        return any(k.check == self.killer for k in self.kills)


def catalog(patch_name: str = patch_mod.DEFAULT_PATCH) -> dict[str, dict]:
    return dict(patch_mod.load_patch(patch_name).variants)


def run_mutant(repo: git.Repo, base: str, name: str, meta: dict, workloads: list[Workload], *, repeat: int,
               right_tree, layout: str, opts: build_mod.Options, out_dir: Path, reuse: dict,
               say: Callable[[str], None], progress: Callable[[str], None],
               patch_name: str = patch_mod.DEFAULT_PATCH,
               judges: tuple[str, ...] = ("static", "property", "suite")) -> MutantResult:
    """One mutant, judged by `judges` (all three for the campaign; a test may ask for one). The
    static checks and the property harness read the eviction patch's code: a preemption patch's
    variants are judged by the suite (its own expectations) alone."""
    t0 = time.monotonic()
    expect = patch_mod.load_patch(patch_name).expect
    if expect != "eviction":
        judges = tuple(j for j in judges if j == "suite")

    def result(status: str, kills=(), note="") -> MutantResult:
        return MutantResult(name, meta.get("class", ""), meta.get("what", ""), meta.get("killer", ""), layout,
                            status, tuple(kills), time.monotonic() - t0, note, repeat)

    cand, _ = apply_mod.candidate_commit(repo, base, patch_name, "largest", name, opts, progress)
    if repo.commit(cand).tree == right_tree:
        return result("not-applicable", note=f"renders the right patch on layout {layout}")
    kills: list[Kill] = []
    if "static" in judges:
        try:
            st = check_mod.check(repo, cand, patch_name, opts, progress, compile=False)  # the build compiles it
            kills += [Kill(c.name, "static", c.detail) for c in st.static if c.status == "fail"]
        except (PatchError, BuildError, LayoutError) as e:
            kills.append(Kill("static-checks", "static", str(e)))
    if "property" in judges and layout in ("C", "C2", "D"):
        try:
            pr = check_mod.property_check(repo, cand, opts=opts, progress=progress)
            if not pr.ok:
                kills.append(Kill("property", "property", pr.output.splitlines()[-1] if pr.output else "failed"))
        except (PatchError, BuildError, LayoutError) as e:
            kills.append(Kill("property", "property", str(e)))
    if "suite" in judges:
        try:
            res = verify_mod.run_suite(repo, base, cand, workloads, repeat=repeat, work_dir=out_dir / name,
                                       opts=opts, candidate_label=f"mutant {name}", layout=layout,
                                       expect=expect, evicting_patch=True,
                                       reuse=reuse, say=say, progress=progress)
        except BuildError as e:
            return result("killed", kills + [Kill("compiles", "build", str(e))])  # run 0: deterministic
        for wr in res.results:
            for v in wr.verdicts:
                if v.side != "candidate":
                    continue
                kills += [Kill(c.name, f"{wr.workload.name} run {v.run_index + 1}", c.detail, v.run_index + 1)
                          for c in v.checks if c.status == "fail"]
    return result("killed" if kills else "ALIVE", kills)


def campaign(repo: git.Repo, base: str, names: list[str], workloads: list[Workload], *, repeat: int = 1,
             opts: build_mod.Options = build_mod.Options(), out_dir: Path, say=print, progress=lambda s: None,
             patch_name: str = patch_mod.DEFAULT_PATCH) -> tuple[MutantResult, ...]:
    cat = catalog(patch_name)
    unknown = [n for n in names if n not in cat]
    if unknown:
        from .errors import UsageError
        raise UsageError(f"unknown mutant(s) {', '.join(unknown)}; the catalog: {', '.join(cat)}.")
    right, an = apply_mod.candidate_commit(repo, base, patch_name, "largest", None, opts, progress)
    layout = an.facts.layout if an.facts else "?"
    reuse: dict = {}
    out = []
    for k, name in enumerate(names, 1):
        say(f"==> mutant {k}/{len(names)}: {name} ({cat[name].get('what', '')})")
        r = run_mutant(repo, base, name, cat[name], workloads, repeat=repeat, right_tree=repo.commit(right).tree,
                       layout=layout, opts=opts, out_dir=out_dir, reuse=reuse, say=say, progress=progress,
                       patch_name=patch_name)
        first = r.kills[0] if r.kills else None
        say(f"    {name}: {r.status}" + (f" by {first.check} ({first.where})" if first else "") + f", {r.seconds:.0f} s")
        out.append(r)
    return tuple(out)


def score(results: tuple[MutantResult, ...]) -> tuple[int, int]:
    """(killed, judged): mutants claimed equivalent and not killed, and those that render the
    right patch on this layout, are not counted."""
    judged = [r for r in results if r.status != "not-applicable" and not (r.killer == "equivalent"
                                                                           and r.status == "ALIVE")]
    return sum(r.status == "killed" for r in judged), len(judged)


def table(results: tuple[MutantResult, ...]) -> str:
    rows = [("mutant", "class", "layout", "status", "runs", "killed by (first of each check)")]
    for r in results:
        seen: dict[str, Kill] = {}
        for k in r.kills:
            seen.setdefault(k.check, k)
        by = "; ".join(f"{k.check} [{k.where}]" for k in seen.values())
        status = r.status if not (r.killer == "equivalent" and r.status == "ALIVE") else "equivalent (claimed)"
        runs = f"{r.runs_killed}/{r.repeat}" if r.status != "not-applicable" else "-"
        rows.append((r.name, r.cls, r.layout, status, runs, by or r.note or "-"))
    w = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = ["  ".join(x.ljust(w[i]) for i, x in enumerate(row[:5])) + "  " + row[5] for row in rows]
    killed, judged = score(results)
    lines.append(f"mutation score: {killed}/{judged} killed"
                 + (f" ({100 * killed / judged:.0f} %)" if judged else ""))
    for r in results:
        for k in r.kills:
            if k.check == r.killer:
                lines.append(f"  {r.name}: {k.check} [{k.where}]: {k.reason[:240]}")
                break
    return "\n".join(lines)
