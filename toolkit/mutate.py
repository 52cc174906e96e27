"""The mutation campaign: a check is only as strong as the wrong patches it kills.

Every mutant of patches/<name>/patch.toml ([variants.*]: an edit of the rendered right patch,
patch._variant_edit) is rendered on the base as commit objects and judged exactly as a candidate
is: the static checks of the patched TU, the C++ property harness of the batch surgery, and the
workload suite against the same base. A mutant is
killed when any check fails, and each failing check is kept with its reason; not-reached when
nothing failed and its killer skipped in every run (the shape it judges never happened); ALIVE otherwise.
The suite runs the family's whole catalog from ONE build (catalog_schema, toolkit/variant_schema.py),
the variant selected by its id at run time, and the base side's runs and controls are made once
per campaign and shared (verify.run_suite's `reuse`), so a mutant costs its candidate runs.
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
from . import variant_schema
from . import verify as verify_mod
from .errors import BuildError, LayoutError, PatchError
from .workload import Workload

# The preemption patches' broken variants: the baseline overflow, and the same with a sampler that
# carries state (a repetition penalty), which greedy sampling alone does not.
PREEMPTION_WORKLOADS = ["overflow-4", "preempt-penalty-4"]


def default_workloads(patch_name: str, names: list[str], fallback: list[str]) -> list[str]:
    """The workloads `mutants` runs when none are given: the union, in order, of the ones each
    selected variant's patch.toml entry names as its killers (`workloads`), after `fallback` when
    a selected variant names none (the eviction's catalog: the default suite kills those)."""
    cat = catalog(patch_name)
    out: list[str] = []
    for n in names:
        if not cat.get(n, {}).get("workloads"):
            out = list(fallback)
            break
    for n in names:
        out += [w for w in cat.get(n, {}).get("workloads", ()) if w not in out]
    return out or list(fallback)


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
    built: str = ""             # what the suite ran: "schema <commit> K" (the catalog's one build) or "alone <commit>"

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
               judges: tuple[str, ...] = ("static", "property", "suite"),
               model_name: str | None = None) -> MutantResult:
    """One mutant, judged by `judges` (all three for the campaign; a test may ask for one). The
    static checks and the property harness read the eviction patch's code: a preemption patch's
    variants are judged by the suite (its own expectations) alone."""
    t0 = time.monotonic()
    expect = patch_mod.load_patch(patch_name).expect
    if expect != "eviction":
        judges = tuple(j for j in judges if j == "suite")

    built = ""

    def result(status: str, kills=(), note="") -> MutantResult:
        return MutantResult(name, meta.get("class", ""), meta.get("what", ""), meta.get("killer", ""), layout,
                            status, tuple(kills), time.monotonic() - t0, note, repeat, built)

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
        # the family's catalog compiled once (variant_schema): this variant selected at run time
        sha, env, built = cand, meta.get("env"), f"alone {cand}"
        schema = _schema_once(reuse, repo, base, patch_name, opts, progress)
        if schema and name in schema[1].ids:
            sha, env, built = schema[0], {**(env or {}), **schema[1].env(name)}, f"schema {schema[0]} {schema[1].ids[name]}"
        try:
            res = verify_mod.run_suite(repo, base, sha, workloads, repeat=repeat, work_dir=out_dir / name,
                                       opts=opts, candidate_label=f"mutant {name}", layout=layout,
                                       expect=expect, evicting_patch=True, patch_expect=expect,
                                       reuse=reuse, say=say, progress=progress, family=patch_name,
                                       candidate_env=env, model_name=model_name)
        except BuildError as e:
            return result("killed", kills + [Kill("compiles", "build", str(e))])  # run 0: deterministic
        found, skipped = suite_kills(res.results, meta.get("killer", ""))
        kills += found
        if not kills and skipped:
            return result("not-reached", note=skipped)
    return result("killed" if kills else "ALIVE", kills)


def catalog_schema(repo: git.Repo, base: str, patch_name: str, opts: build_mod.Options,
                   progress: Callable[[str], None]) -> tuple[str, variant_schema.Schema] | None:
    """Every variant of `patch_name`'s catalog on `base` in ONE build (toolkit/variant_schema.py):
    (its commit, built, and the schema), or None when no variant can share it. Made once per
    content (the right patch's tree, each variant's text, the build's flags) and kept in the
    cache, so each later mutant of the family, in any process, costs no compile and no parse."""
    from . import cache, codeindex

    spec = patch_mod.load_patch(patch_name)
    right, an = apply_mod.candidate_commit(repo, base, patch_name, "largest", None, opts, progress)
    rel, right_text = an.file, patch_mod.stage_texts(an.source, an.facts, spec, "largest", None)[-1][1].decode()
    texts = {}
    for name in spec.variants:
        try:
            texts[name] = patch_mod.stage_texts(an.source, an.facts, spec, "largest", name)[-1][1].decode()
        except PatchError:
            continue   # the variant's own build says why (run_mutant renders it alone)
    key = cache.digest(repo.commit(right).tree.hexsha, rel, opts.key(), sorted(
        (n, cache.digest(t)) for n, t in texts.items()))

    def make() -> dict:
        with build_mod.held(repo, right, opts, progress) as ws:
            progress(f"parsing {rel} with libclang for the catalog's schema")
            blocks = variant_schema.blocks_of(codeindex.parse(ws.compile_command(rel)))

        def compiles(schema: variant_schema.Schema) -> str:
            sha = apply_mod.commit_text(repo, right, rel, schema.text.encode(), _schema_message(spec, schema))
            try:
                build_mod.build(repo, sha, opts, progress)
                return ""
            except BuildError as e:
                return e.output()
        schema = variant_schema.settle(right_text, texts, blocks, compiles, progress, build_mod.first_error)
        return {"text": schema.text, "ids": schema.ids, "alone": schema.alone}

    doc, _back = cache.kept(key, make)
    if not doc["ids"]:
        return None
    schema = variant_schema.Schema(doc["text"], doc["ids"], doc["alone"])
    # the commit is made again where this repository lacks it: the same tree, so the same binary
    sha = apply_mod.commit_text(repo, right, rel, schema.text.encode(), _schema_message(spec, schema))
    build_mod.build(repo, sha, opts, progress)
    return sha, schema


def _schema_once(reuse: dict, repo: git.Repo, base: str, patch_name: str, opts: build_mod.Options,
                 progress: Callable[[str], None]) -> tuple[str, variant_schema.Schema] | None:
    """catalog_schema once per campaign (`reuse` is the campaign's): keying the cache renders every
    variant (0.8 s), and the schema's commit and build lookup need not be made per mutant."""
    key = ("catalog schema", repo.working_dir, base, patch_name, opts.key())
    if key not in reuse:
        reuse[key] = catalog_schema(repo, base, patch_name, opts, progress)
    return reuse[key]


def _schema_message(spec, schema: variant_schema.Schema) -> str:
    return (f"patchkit: the catalog of {spec.name} as one schema ({len(schema.ids)} variants; "
            f"{variant_schema.ENV}=K selects one)\n\n" + "".join(f"{k}: {n}\n" for n, k in schema.ids.items()))


def suite_kills(results, killer: str) -> tuple[list[Kill], str]:
    """Every failing check of the candidate's verdicts (with where and why), and, when no run
    reached what the mutant's own killer judges (the killer skipped, or the run missed the shape
    its workload is designed for: compare.SHAPE_CHECKS inconclusive), why: a mutant nothing failed
    is then not-reached (no evidence either way), not ALIVE."""
    from .compare import SHAPE_CHECKS

    kills, missed, n = [], [], 0
    for wr in results:
        for v in wr.verdicts:
            if v.side != "candidate":
                continue
            n += 1
            where = f"{wr.workload.name} run {v.run_index + 1}"
            kills += [Kill(c.name, where, c.detail, v.run_index + 1) for c in v.checks if c.status == "fail"]
            why = ([f"{killer} skipped on {where}: {c.detail}" for c in v.checks if c.name == killer and c.status == "skip"]
                   or [f"{c.name} not reached on {where}: {c.detail}" for c in v.checks
                       if c.name in SHAPE_CHECKS and c.status == "inconclusive"])
            missed += why[:1]
    return kills, "; ".join(missed) if n and len(missed) == n else ""


def campaign(repo: git.Repo, base: str, names: list[str], workloads: list[Workload], *, repeat: int = 1,
             opts: build_mod.Options = build_mod.Options(), out_dir: Path, say=print, progress=lambda s: None,
             patch_name: str = patch_mod.DEFAULT_PATCH, model_name: str | None = None) -> tuple[MutantResult, ...]:
    cat = catalog(patch_name)
    unknown = [n for n in names if n not in cat]
    if unknown:
        from .errors import UsageError
        raise UsageError(f"unknown mutant(s) {', '.join(unknown)}; the catalog: {', '.join(cat)}.")
    right, an = apply_mod.candidate_commit(repo, base, patch_name, "largest", None, opts, progress)
    layout = an.facts.layout if an.facts else "?"
    reuse: dict = {}
    sch = _schema_once(reuse, repo, base, patch_name, opts, progress)
    if sch:
        mine = [n for n in names if n in sch[1].ids]
        say(f"catalog: {len(mine)} of the {len(names)} variants in one build ({sch[0][:12]}; "
            f"{variant_schema.ENV}=K selects one)" + "".join(
                f"; {n} built alone: {why}" for n, why in sch[1].alone.items() if n in names))
    out = []
    for k, name in enumerate(names, 1):
        say(f"==> mutant {k}/{len(names)}: {name} ({cat[name].get('what', '')})")
        r = run_mutant(repo, base, name, cat[name], workloads, repeat=repeat, right_tree=repo.commit(right).tree,
                       layout=layout, opts=opts, out_dir=out_dir, reuse=reuse, say=say, progress=progress,
                       patch_name=patch_name, model_name=model_name)
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


# ------------------------------------------------------------------ operator mutants (issue 26)

@dataclass(frozen=True)
class OperatorResult:
    id: int
    line: int
    operator: str
    original: str
    mutated: str
    context: str                # the source line (operator, context, original, mutated: the stable key)
    status: str                 # killed | ALIVE | equivalent (ALIVE, argued in patch.toml) | tce (the right
                                # patch's code) | tce-duplicate (an earlier mutant's code): toolkit/tce.py
    check: str = ""             # the first failing check
    where: str = ""             # "<workload> run 1"
    reason: str = ""            # its detail; for an argued equivalent: the argument
    seconds: float = 0.0


@dataclass(frozen=True)
class OperatorCampaign:
    base: str
    schema_commit: str
    schema_tree: str            # the schema's content: every shard writes its own commit of the same tree
    generated: int              # mutants made by the operators, duplicates included
    duplicates: int
    stillborn: tuple[int, ...]  # ids whose switch did not compile
    results: tuple[OperatorResult, ...]
    schema_build_s: float       # the one compile (with its stillborn retries) and link
    seconds: float
    tce: str = ""               # how trivial compiler equivalence was measured, or why it was not
    model: str = ""             # what served the workloads (--model; "" = each workload's own, the witness)
    schema_read_back: bool = False  # the schema (its sites, its stillborn) made by an earlier run for this tree

    @property
    def killed(self) -> int:
        return sum(r.status == "killed" for r in self.results)

    @property
    def alive(self) -> list[OperatorResult]:
        return [r for r in self.results if r.status == "ALIVE"]


def operator_campaign(repo: git.Repo, base: str, workloads: list[Workload], *, sample_n: int | None = None,
                      seed: int = 0, shard: tuple[int, int] = (1, 1), out_dir: Path, say=print,
                      progress=lambda s: None, patch_name: str = patch_mod.DEFAULT_PATCH,
                      model_name: str | None = None) -> OperatorCampaign:
    """Every operator mutant of the lines `patch_name` adds (toolkit/operators.py), compiled into
    ONE schema binary, each selected at run time and judged by the workloads in order, stopping at
    the first failed check. `sample_n`/`seed`: a seeded sample; `shard` (k, n): every n-th from k."""
    from . import operators

    t0 = time.monotonic()
    spec = patch_mod.load_patch(patch_name)
    right, an = apply_mod.candidate_commit(repo, base, patch_name, "largest", None, build_mod.Options(), progress)
    rel = an.file
    t = time.monotonic()
    schema, dead, read_back = _operator_schema(repo, base, right, rel, spec, say, progress)
    sha = apply_mod.commit_text(repo, right, rel, schema.text.encode(), _operator_message(spec, schema))
    build_mod.build(repo, sha, build_mod.Options(), progress)   # found by its tree when the schema was built before
    build_s = time.monotonic() - t
    generated = len(schema.mutants) + len(dead) + schema.duplicates
    chosen = operators.sample(schema.mutants, sample_n, seed)
    k, n = shard
    chosen = tuple(m for i, m in enumerate(chosen) if i % n == k - 1)
    equivalent = {(e["operator"], e["context"], e["original"], e["mutated"]): e["why"] for e in spec.equivalent}
    from . import tce as tce_mod
    with build_mod.held(repo, sha, build_mod.Options(), progress) as ws:
        same = tce_mod.measure_cached(schema.text, ws.compile_command(rel), [m.id for m in schema.mutants],
                               out_dir / "tce", operators.SWITCH, progress)
    if same is None:
        tce_how = "not measured: no clang++ with LLVM's opt and llvm-extract here (Debian: clang, llvm)"
    else:
        tce_how = (f"{same.compiler.split(' (')[0]} -O2 of the {len(same.functions) - 1} function(s) holding a switch, "
                   f"{len(same.equivalent)} of {len(schema.mutants)} equal to the right patch or an earlier mutant, "
                   f"{same.seconds:.0f} s" + (" (measured once for this schema, read back)" if same.cached else ""))
    say(f"TCE: {tce_how}")
    reuse: dict = {}
    say("[schema] the right patch (no mutant selected) through the suite")
    right_res = verify_mod.run_suite(repo, base, sha, workloads, work_dir=out_dir / "schema", expect="eviction",
                                     evicting_patch=True, reuse=reuse, say=lambda s: None, progress=progress,
                                     shapes=spec.shapes, pairs=spec.pairs, candidate_env={operators.ENV: "0"},
                                     model_name=model_name, family=spec.name)  # the family's promises
    if not right_res.ok:
        bad = [f"{w.workload.name}: {c.name}" for w in right_res.results for v in w.verdicts for c in v.checks
               if c.status == "fail"]
        raise PatchError(f"the operator schema with no mutant selected fails the suite ({'; '.join(bad[:5])}): the "
                         "schema changed the right patch's behaviour, so no mutant could be judged.")
    # the C++ property harness, compiled once from the schema with ASan + UBSan: it reaches the embd
    # paths no request reaches at run time (docs/DESIGN.md section 8), and an out-of-bounds read
    # whose result is later overwritten shows; each mutant runs it with its id selected
    harness = None
    try:
        pr = check_mod.property_check(repo, sha, 2000, progress=progress, sanitize=True)
        if pr.ok:
            import shutil
            with build_mod.held(repo, sha, build_mod.Options(), progress) as ws:
                out_dir.mkdir(parents=True, exist_ok=True)
                harness = Path(shutil.copy(ws.root / "property" / "harness", out_dir / "harness"))
    except (PatchError, BuildError) as e:
        say(f"  property harness not used: {e}")
    results = []
    for i, m in enumerate(chosen, 1):
        t = time.monotonic()
        killed = None
        twin = same.equivalent.get(m.id) if same else None
        if twin:
            killed = OperatorResult(m.id, m.line, m.operator, m.original, m.mutated, m.context,
                                    "tce" if twin == "the right patch" else "tce-duplicate", "TCE", "",
                                    f"compiles to {twin}'s code ({tce_how.split(' of the')[0]})")
        if harness is not None and killed is None:
            pr = check_mod.run_harness(harness, sha, 2000, env={operators.ENV: str(m.id)})
            if not pr.ok:
                out = pr.output.splitlines() or ["failed"]
                why = next((x for x in out if "ERROR: AddressSanitizer" in x or "runtime error" in x or
                            x.startswith("FAIL")), out[-1])
                killed = OperatorResult(m.id, m.line, m.operator, m.original, m.mutated, m.context, "killed", "property",
                                        "property harness", why.strip()[:300], time.monotonic() - t)
        if killed is None:
            # stopping at the first workload whose candidate fails a check (run_suite's fail_fast):
            # one kill is the verdict, the rest of the suite would only repeat it
            res = verify_mod.run_suite(repo, base, sha, list(workloads), work_dir=out_dir / f"m{m.id}", expect="eviction",
                                       evicting_patch=True, reuse=reuse, say=lambda s: None, progress=progress,
                                       shapes=spec.shapes, pairs=spec.pairs, candidate_env={operators.ENV: str(m.id)},
                                       model_name=model_name, family=spec.name, fail_fast=True)
            fails = [(w.workload, c, v) for w in res.results for v in w.verdicts if v.side == "candidate"
                     for c in v.checks if c.status == "fail"]
            if fails:
                wl, c, v = fails[0]
                killed = OperatorResult(m.id, m.line, m.operator, m.original, m.mutated, m.context, "killed", c.name,
                                        f"{wl.name} run {v.run_index + 1}", c.detail[:300], time.monotonic() - t)
        if killed is None:
            why = equivalent.get(m.key)
            killed = OperatorResult(m.id, m.line, m.operator, m.original, m.mutated, m.context,
                                    "equivalent" if why else "ALIVE", reason=why or "", seconds=time.monotonic() - t)
        say(f"  [{i}/{len(chosen)}] #{m.id} {m.diff()}: {killed.status}"
            + (f" by {killed.check} ({killed.where})" if killed.check else ""))
        results.append(killed)
    # (the schema with no mutant selected passed the suite: the campaign raises before judging otherwise)
    return OperatorCampaign(base, sha, repo.commit(sha).tree.hexsha, generated, schema.duplicates, tuple(sorted(dead)),
                            tuple(results), build_s, time.monotonic() - t0, tce_how, model_name or "", read_back)


def _operator_message(spec, schema) -> str:
    return f"patchkit: operator mutant schema of {spec.name} ({len(schema.mutants)} mutants)"


def _operator_schema(repo: git.Repo, base: str, right: str, rel: str, spec, say, progress):
    """(the operator schema of the right patch's `rel`, its stillborn mutants' ids, whether it was
    read back). Made once per content (the right patch's tree, the build's flags, operators.py's
    own code) and kept in the cache: a campaign's shards and its later runs pay no libclang parse
    (6 s measured) and no stillborn rounds (each a compile of the TU)."""
    from . import cache, codeindex, operators

    opts = build_mod.Options()
    key = cache.digest("operators", repo.commit(right).tree.hexsha, rel, opts.key(),
                       Path(operators.__file__).read_bytes())

    def make() -> dict:
        from dataclasses import asdict
        with build_mod.held(repo, right, opts, progress) as ws:
            source = (ws.src / rel).read_text()
            added = check_mod.added_lines(repo.git.show(f"{base}:{rel}"), source)
            progress(f"parsing {rel} with libclang for operator sites")
            tu = codeindex.parse(ws.compile_command(rel))  # the AST stays valid once the workspace moves on
        dead: set[int] = set()
        for _ in range(5):
            schema = operators.build_schema(tu, source, added, frozenset(dead))
            sha = apply_mod.commit_text(repo, right, rel, schema.text.encode(), _operator_message(spec, schema))
            say(f"schema: {len(schema.mutants)} mutants on {len(added)} added lines; compiling the TU once")
            try:
                build_mod.build(repo, sha, opts, progress)
                break
            except BuildError as e:
                log = e.output()
                bad = operators.stillborn(log, schema) - dead
                if not bad:
                    raise
                say(f"  stillborn (does not compile): {sorted(bad)}; building the schema without them")
                dead |= bad
        else:
            raise BuildError("the operator schema did not compile after 5 rounds of removing stillborn mutants")
        return {"text": schema.text, "mutants": [asdict(m) for m in schema.mutants],
                "duplicates": schema.duplicates, "dead": sorted(dead), "added": len(added)}

    doc, back = cache.kept(f"operators-{key}", make)
    schema = operators.Schema(doc["text"], tuple(operators.Mutant(**m) for m in doc["mutants"]), doc["duplicates"])
    if back:
        say(f"schema: {len(schema.mutants)} mutants on {doc['added']} added lines (made once for this tree, "
            "read back)")
    return schema, frozenset(doc["dead"]), back


def merge_operator_docs(docs: list[dict]) -> OperatorCampaign:
    """The shards of one operator campaign (`mutants --operators --shard K/N`, each its operators.json)
    joined into one: they must share the base and the schema (the same mutants, the same ids); each
    mutant is judged by one shard. The campaign's time is the longest shard's (a matrix runs them side
    by side)."""
    from .errors import UsageError

    if not docs:
        raise UsageError("nothing to merge: give the report directories of the shards.")
    # a shard's schema commit is its own (its time); the schema's tree is the campaign's
    keys = {(d["base"], d["schema_tree"], d["generated"], tuple(d["stillborn"]), d.get("model", "")) for d in docs}
    if len(keys) > 1:
        raise UsageError("these operators.json are not shards of one campaign (their base, schema, mutants or model "
                         f"differ: {sorted({k[1][:12] for k in keys})}); merge the shards of one `--operators` run.")
    results: dict[int, OperatorResult] = {}
    for d in docs:
        for m in d["mutants"]:
            r = OperatorResult(**m)
            if r.id in results and results[r.id] != r:
                raise UsageError(f"mutant #{r.id} was judged by two shards with different results; were the "
                                 "shards given the same --shard twice?")
            results[r.id] = r
    d0 = docs[0]
    return OperatorCampaign(d0["base"], d0["schema_commit"], d0["schema_tree"], d0["generated"], d0["duplicates"],
                            tuple(d0["stillborn"]),
                            tuple(results[k] for k in sorted(results)), max(d["schema_build_s"] for d in docs),
                            max(d["seconds"] for d in docs), d0.get("tce", ""), d0.get("model", ""),
                            all(d.get("schema_read_back", False) for d in docs))


def operator_doc(c: OperatorCampaign) -> dict:
    """operators.json: everything `merge_operator_docs` needs, and the counts a reader wants."""
    from dataclasses import asdict
    return {"base": c.base, "schema_commit": c.schema_commit, "schema_tree": c.schema_tree, "generated": c.generated,
            "duplicates": c.duplicates,
            "stillborn": list(c.stillborn), "killed": c.killed, "alive": len(c.alive),
            "schema_build_s": round(c.schema_build_s, 1), "seconds": round(c.seconds, 1),
            "tce": c.tce, "model": c.model, "schema_read_back": c.schema_read_back,
            "tce_equivalent": sum(r.status == "tce" for r in c.results),
            "tce_duplicates": sum(r.status == "tce-duplicate" for r in c.results),
            "mutants": [asdict(x) for x in c.results]}


def operator_table(c: OperatorCampaign) -> str:
    tce = [r for r in c.results if r.status.startswith("tce")]
    judged = [r for r in c.results if r.status in ("killed", "ALIVE")]
    by: dict[str, int] = {}
    for r in c.results:
        if r.status == "killed":
            by[r.check] = by.get(r.check, 0) + 1
    lines = [f"operator mutants of the patch's added lines (schema {c.schema_commit[:12]}, one build: "
             f"{c.schema_build_s:.0f} s; campaign {c.seconds:.0f} s)",
             f"  generated {c.generated}, duplicates {c.duplicates}, stillborn {len(c.stillborn)}, chosen "
             f"{len(c.results)} (of {c.generated - c.duplicates - len(c.stillborn)}), TCE-equivalent "
             f"{sum(r.status == 'tce' for r in tce)}, TCE-duplicates {sum(r.status == 'tce-duplicate' for r in tce)}, "
             f"argued equivalent {sum(r.status == 'equivalent' for r in c.results)}",
             f"  TCE: {c.tce or 'not measured'}",
             f"  killed {c.killed} of {len(judged)} non-equivalent"
             + (f" ({100 * c.killed / len(judged):.0f} %)" if judged else "") + ": "
             + ", ".join(f"{k} {v}" for k, v in sorted(by.items(), key=lambda x: -x[1]))]
    for r in c.results:
        if r.status != "killed":
            lines.append(f"  {r.status}: #{r.id} line {r.line} [{r.operator}] {r.original!r} -> {r.mutated!r}"
                         + (f"  ({r.reason})" if r.reason else ""))
    return "\n".join(lines)
