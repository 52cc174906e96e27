"""The whole proof, one way: base + candidate commits -> builds -> workload runs -> verdicts.

This module only composes the stages (build, model, workload, compare); it decides
nothing itself. The CLI prints what it returns; report.py writes it to disk.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import git

from .errors import UsageError

from . import build as build_mod
from . import sensitivity
from . import compare, measure, model, promises, upstream_unified
from . import coverage as coverage_mod
from .record import Run
from .runner import run as run_workload
from . import runner as runner_mod
from .workload import Workload
from .workload import load as load_workload
from .ui import log_progress


@dataclass(frozen=True)
class WorkloadResult:
    workload: Workload
    base: tuple[Run, ...]
    candidate: tuple[Run, ...]
    control: Run | None
    verdicts: tuple[compare.Verdict, ...]
    model: str = "witness"
    model_sha256: str = ""
    # upstream-unified only: llama.cpp's own test's rule on the same runs, beside patchkit's verdict
    # (shown in the reports; it decides nothing: `ok` is patchkit's verdicts alone)
    upstream_test: upstream_unified.Comparison | None = None

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)


@dataclass(frozen=True)
class Result:
    repo: str
    base_commit: str
    candidate_commit: str | None
    candidate_label: str
    candidate_source: str | None  # the commit the candidate came from (--commit / --candidate): what pin checks
    policy: str
    layout: str | None
    results: tuple[WorkloadResult, ...]
    timings: tuple[tuple[str, float], ...]
    model_sha256: str
    expect: str = "eviction"      # the expectations applied: eviction | no-regression
    expect_why: str = ""
    base_why: str = ""            # how the base was chosen (the candidate's is candidate_label)
    # the failure-point shapes the candidate's runs reached (coverage.py), each with its first run
    coverage: tuple[coverage_mod.Reached, ...] = ()
    # the pairs of the failure point (the victim's undecoded entries x a survivor's place; a preemption
    # family's victim is the slot it parked), each with its first run
    pairs: tuple[coverage_mod.Reached, ...] = ()
    # the family's patch.toml `pairs` (what its suite run must reach to PASS); None: the eviction's
    # rule (every reachable pair, for the largest policy the workloads are sized for). What is
    # judged, after the policy, is `promised_pairs` below
    family_pairs: tuple[str, ...] | None = None
    # the candidate is patchkit's own series (its policy is its promise); else its policy is only
    # what was measured, and the reports say so (issue 28)
    own: bool = True
    # what the candidate was judged to promise beyond the property, and where that was found
    # (promises.Declared.text); "" for a foreign candidate (the property alone)
    promises: str = ""
    # per model served: what a one-cell change of its history does to its stream (sensitivity.py),
    # or why it was not measured: the strength of every "equals its control" above rests on it
    sensitivity: tuple[tuple[str, object], ...] = ()
    # the workloads --fail-fast did not run, after one whose candidate failed a check
    not_run: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """No check failed: no evidence against the candidate (INCONCLUSIVE is ok, not PASS)."""
        return all(r.ok for r in self.results)

    @property
    def promised_pairs(self) -> tuple[str, ...]:
        """Judged: the family's promise, or the eviction's every reachable pair, under the largest
        policy the workloads are sized for (and the promises were measured under); else listed."""
        if self.policy != "largest":
            return ()
        if self.family_pairs is not None:
            return self.family_pairs
        return coverage_mod.PAIRS if self.expect == "eviction" else ()

    @property
    def outcome(self) -> str:
        """PASS: every check held on evidence and every declared shape was reached. FAIL: evidence
        against the candidate (a check failed, quoted in the report). INCONCLUSIVE: nothing against
        it, but a shape was not reached or evidence was missing."""
        if not self.ok:
            return "FAIL"
        if self.not_run:    # stopped on a failure the final expectations did not confirm: nothing judged them
            return "INCONCLUSIVE"
        missing = any(c.status == "inconclusive" for wr in self.results for v in wr.verdicts for c in v.checks)
        # the coverage table's shapes are the default suite's promise: a run of the whole suite that
        # missed one is inconclusive; a run of a few workloads you chose only lists what they missed
        ran = {wr.workload.name for wr in self.results}
        suite = set(SUITE) <= ran or set(REAL_SUITE) <= ran
        # the pairs likewise: each is some suite workload's by design (its `expect.pairs`, a start
        # that missed them made again), for the largest policy the workloads are sized for
        pairs = tuple(c for c in self.pairs if c.shape in self.promised_pairs)
        return ("INCONCLUSIVE" if missing or (suite and (coverage_mod.missed(self.coverage) or coverage_mod.missed(pairs)))
                else "PASS")


Say = Callable[[str], None]
SHARED_NOTE = "  read back: measured earlier in this job (PATCHKIT_SHARED_RUNS)"


def judge(wl: Workload, side: str, run: Run, index: int = 0, control: Run | None = None, policy: str = "largest",
          base: Run | None = None, expect: str = "eviction", base_reference: bool = False,
          own: compare.Promises = compare.NONE) -> compare.Verdict:
    """Measure the run once, then judge the measurement (compare.py never measures)."""
    return compare.judge(measure.measure(run, wl, policy), side, index, control, base, expect, base_reference, own)


def run_suite(repo: git.Repo, base_commit: str, candidate_commit: str | None, workloads: list[Workload], *,
              repeat: int = 1, work_dir: Path, opts: build_mod.Options = build_mod.Options(),
              policy: str = "largest", candidate_label: str = "", candidate_source: str | None = None,
              layout: str | None = None, model_name: str | None = None, expect: str = "auto",
              evicting_patch: bool = False, base_reference: bool = False, sides: tuple[str, str] = ("base", "candidate"),
              reuse: dict | None = None, say: Say = print, progress: Say = lambda s: None,
              patch_expect: str = "eviction", shapes: tuple[str, ...] | None = None,
              pairs: tuple[str, ...] | None = None,
              candidate_env: dict[str, str] | None = None, candidate_args: tuple[str, ...] = (),
              family: str = "", declared: promises.Declared | None = None, fail_fast: bool = False) -> Result:
    """`reuse`: a dict the caller keeps across calls with the same base (the mutation campaign):
    each workload's control and base runs are made once and shared by every candidate.
    `patch_expect`: what patchkit's own candidate series promises (its patch.toml `expect`).
    `shapes`: the failure-point shapes the candidate's handler can meet (its patch.toml); None:
    every shape of the applied expectations (a candidate that is not patchkit's). `pairs`: the pairs
    its patch.toml promises the default suite reaches (None: the eviction's rule, Result.promised_pairs).
    `candidate_env`, `candidate_args`: added to the candidate's servers' environment (a mutant's id, a
    PR's knob) and command line (a PR's own flags, e.g. --preempt-ram 0).
    `family`: which of patchkit's series the candidate is (its patch name), for the promises only
    that series makes (the resume path of a park); "" for any other candidate.
    `declared`: the candidate's promises as found by promises.of_candidate (a declaration, a trailer,
    its code); when given it decides the promises judged, whatever `family` says.
    `fail_fast`: after the first workload whose candidate fails a check (judged on the expectations
    the runs so far decide), run no other; they are listed in `not_run`."""
    timings: list[tuple[str, float]] = []

    def timed(name, fn):
        t = time.monotonic()
        out = fn()
        timings.append((name, time.monotonic() - t))
        return out

    b_name, c_name = sides        # what the progress lines call the two sides (the gate: before/after)
    say(f"building {b_name} {base_commit[:12]}")
    base_bin = timed("build base", lambda: build_mod.build(repo, base_commit, opts, progress))
    say(f"  {b_name} binary: {base_bin.binary}{' (cached)' if base_bin.reused else f' ({base_bin.seconds:.0f} s)'}")
    cand_bin = None
    if candidate_commit:
        say(f"building {c_name} {candidate_commit[:12]}")
        cand_bin = timed("build candidate", lambda: build_mod.build(repo, candidate_commit, opts, progress))
        say(f"  {c_name} binary: {cand_bin.binary}"
            f"{' (cached)' if cand_bin.reused else f' ({cand_bin.seconds:.0f} s)'}")
    models = {name: model.resolve(name, say) for name in dict.fromkeys(model_name or w.model for w in workloads)}
    sens = tuple((name, sensitivity.for_report(repo, base_commit, name, opts, progress)) for name in models
                 if name in model.FAMILIES)
    draft = model.ensure(model.DRAFT) if any(w.server.draft for w in workloads) else None
    work_dir.mkdir(parents=True, exist_ok=True)

    def settle(measured) -> tuple[str, str, bool]:
        """The expectations the measured runs decide: (applied, why, whether the base evicts)."""
        return expectations(expect, measured, candidate_label if evicting_patch else None, patch_expect)

    # what the candidate promises besides the property (promises.py; a foreign candidate: nothing)
    if declared is None and evicting_patch and candidate_commit:
        # patchkit's series named by its family (its promises), or unnamed (the operator schema):
        # the promises of its expectation
        declared = (promises.of_family(family, policy, "its family", candidate_env) if family else promises.Declared(
            patch_expect, policy, compare.Promises(witness=patch_expect == "eviction",
                                                   park_bound=measure.PARK_BOUND if patch_expect == "preemption" else 0,
                                                   parked_first=patch_expect == "preemption"),
            "", "patchkit's series"))
    own = declared.own if declared else compare.NONE

    def judged_workload(rec, applied: str, reference: bool) -> WorkloadResult:
        wl, tiny, control, base_runs, cand_runs = rec
        verdicts = []
        for k, r in enumerate(base_runs):
            verdicts.append(judge(wl, "base", r, k, expect=applied, base_reference=reference))
            if k < len(cand_runs):
                # patchkit's own eviction logs one line per eviction: its witness must be readable
                verdicts.append(judge(wl, "candidate", cand_runs[k], k, control, policy, base=r,
                                      expect=applied, base_reference=reference, own=own))
        side_by_side = (upstream_unified.compare_runs(wl, tuple(base_runs), tuple(cand_runs), tuple(verdicts), policy)
                        if wl.name == upstream_unified.WORKLOAD and applied == "eviction" and not reference
                        else None)
        return WorkloadResult(wl, tuple(base_runs), tuple(cand_runs), control, tuple(verdicts),
                              model_name or wl.model, tiny.sha256, side_by_side)

    recorded = []
    not_run: tuple[str, ...] = ()
    t_runs = time.monotonic()
    for i, wl in enumerate(workloads):
        tiny = models[model_name or wl.model]
        wl = model.adapt(wl, model_name or wl.model)
        control = None
        shared = reuse.get((str(base_bin.binary), wl.name, repeat)) if reuse is not None else None
        if shared:
            control, base_runs = shared
            say(f"[{wl.name}] {b_name} runs and control: made once for this base, reused")
        elif cand_bin and wl.expect.integrity:
            say(f"[{wl.name}] control run (no overflow, {b_name} binary)")
            # a control's start is not shaped: no policy in its key
            control, kept = runner_mod.shared("control", base_bin.binary, tiny.path, wl, 0, "-", lambda: run_workload(
                base_bin.binary, tiny.path, wl.control(), work_dir / f"{wl.name}.control.log",
                draft=draft.path if draft else None, want_shape=False, say=say))
            if kept:
                say(SHARED_NOTE)
        if not shared:
            base_runs = []
        cand_runs = []
        # a candidate's request that waits 10x the whole control run without a byte is stuck (a
        # parked slot never resumed): cut there, not after the default 120 s; the reason stays
        wait = idle_timeout(control)
        for k in range(repeat):
            if not shared:
                say(f"[{wl.name}] {b_name} run {k + 1}/{repeat}")
                r, kept = runner_mod.shared("base", base_bin.binary, tiny.path, wl, k, policy, lambda: run_workload(
                    base_bin.binary, tiny.path, wl, work_dir / f"{wl.name}.base.{k}.log",
                    draft=draft.path if draft else None, policy=policy, say=say))
                if kept:
                    say(SHARED_NOTE)
                base_runs.append(r)
            if cand_bin:
                say(f"[{wl.name}] {c_name} run {k + 1}/{repeat}")
                cand_runs.append(run_workload(cand_bin.binary, tiny.path, wl,
                                              work_dir / f"{wl.name}.candidate.{k}.log",
                                              draft=draft.path if draft else None, policy=policy,
                                              probe_pool=True,  # every cell back: preemption's promise
                                              env=candidate_env, extra_args=candidate_args, timeout=wait,
                                              say=say))
                runner_mod.made("candidate", cand_bin.binary, tiny.path, wl, k, policy, cand_runs[-1],
                                (sorted((candidate_env or {}).items()), candidate_args, wait))
        if reuse is not None:
            reuse[(str(base_bin.binary), wl.name, repeat)] = (control, base_runs)
        recorded.append((wl, tiny, control, base_runs, cand_runs))
        if fail_fast and cand_bin and i + 1 < len(workloads):
            applied, _, base_evicts = settle([(w, b, c) for w, _, _, b, c in recorded])
            if not judged_workload(recorded[-1], applied, base_reference or base_evicts).ok:
                not_run = tuple(w.name for w in workloads[i + 1:])
                say(f"[{wl.name}] the candidate failed a check: --fail-fast runs no other workload "
                    f"({len(not_run)} not run)")
                break
    measured = [(w, b, c) for w, _, _, b, c in recorded]
    if (expect == "auto" and cand_bin and not evicting_patch
            and not any(w.expect.base == "all-error" for w in workloads)):
        # whether a side evicts is measured on an overflow workload; without one in this list (a
        # shard of the gate's matrix) run the probe on both sides, so every shard decides alike
        probe = load_workload(PROBE)
        say(f"[{PROBE}] probe runs (measure whether each side evicts; not judged)")
        pm = models[model_name] if model_name else model.resolve(probe.model, say)
        # the base's probe is its overflow-4 run (shared with any suite run of it in this job)
        base_probe, _ = runner_mod.shared("base", base_bin.binary, pm.path, probe, 0, "largest", lambda: run_workload(
            base_bin.binary, pm.path, probe, work_dir / "probe.base.log"))
        measured.append((probe, [base_probe],
                         [run_workload(cand_bin.binary, pm.path, probe, work_dir / "probe.candidate.log")]))
    timings.append(("workloads", time.monotonic() - t_runs))

    applied, why, base_evicts = settle(measured)
    base_reference = base_reference or base_evicts
    say(f"expectations: {applied} ({why})")
    results = []
    for rec in recorded:
        res = judged_workload(rec, applied, base_reference)
        say(f"[{res.workload.name}] {'ok' if res.ok else 'FAILED'}")
        results.append(res)
    shape_set = shapes if shapes is not None else {"eviction": coverage_mod.EVICTION,
                                                  "preemption": coverage_mod.PREEMPTION}.get(applied, ())
    # the judged runs first, then the earlier starts (judged too): a shape is credited to the run
    # whose workload was designed to reach it before a start that happened to
    judged = [(f"{wl.name} run {k + 1}", r, wl) for wl, _, _, _, cand_runs in recorded for k, r in enumerate(cand_runs)]
    judged += [(f"{wl.name} run {k + 1} (start {e.attempts})", e, wl) for wl, _, _, _, cand_runs in recorded
               for k, r in enumerate(cand_runs) for e in r.earlier]
    cov = coverage_mod.matrix(judged, tuple(shape_set), applied, policy) if cand_bin and shape_set else ()
    family_pairs, pairs = pairs, (coverage_mod.pair_matrix(judged, policy, applied)
                                  if cand_bin and applied in ("eviction", "preemption") else ())
    return Result(str(repo.working_tree_dir), base_commit, candidate_commit, candidate_label, candidate_source,
                  policy, layout,
                  tuple(results), tuple(timings), models[next(iter(models))].sha256 if models else "",
                  applied, why, coverage=cov, pairs=pairs, family_pairs=family_pairs, own=evicting_patch or declared is not None or not candidate_commit,
                  sensitivity=sens, promises=declared.text if declared else "", not_run=not_run)


def idle_timeout(control: Run | None, floor: float = runner_mod.IDLE_FLOOR_S, default: float = 120.0) -> float:
    """How long a candidate's request may go without a byte: 10x the control run's whole wall time
    (the same requests with room for all, on the same machine just before), at least `floor`;
    `default` without a control."""
    return default if control is None else max(floor, min(default, 10 * control.wall))


def expectations(expect: str, recorded, patch: str | None = None,
                 patch_expect: str = "eviction") -> tuple[str, str, bool]:
    """(expectations applied, why, does the base side already evict). `auto`: the expectations
    patchkit's own patch promises when the candidate is one (`patch` names it: eviction, or
    preemption for park / recompute); else what the candidate measurably does on an overflow
    workload: it parks a request (pauses it while others go on) -> preemption; it terminates
    fewer requests than were in play -> eviction; else no-regression (any other change: it must
    not make anything worse)."""
    def evicting(side: int) -> list[str]:
        return [w.name for w, *runs in recorded for r in runs[side]
                if w.expect.base == "all-error" and measure.evicts(r, w)]
    base_ev, cand_ev = evicting(0), evicting(1)
    if not any(runs[1] for _, *runs in recorded):
        return "eviction", "baseline only: the base must show the bug", False
    base_note = (f"; the base side already evicts (measured on {', '.join(dict.fromkeys(base_ev))}): it is the "
                 "reference, and the candidate must also not regress from it") if base_ev else ""
    if expect == "eviction":
        return "eviction", "asked for (--expect eviction)" + base_note, bool(base_ev)
    if expect == "no-regression":
        return "no-regression", "asked for (--expect no-regression)", bool(base_ev)
    if expect == "preemption":
        return "preemption", "asked for (--expect preemption)", bool(base_ev)
    if patch:
        return patch_expect, f"auto: the candidate is {patch}" + base_note, bool(base_ev)
    parking = [w.name for w, *runs in recorded for r in runs[1] if w.expect.base == "all-error" and measure.parks(r)]
    if parking:
        return "preemption", ("auto: the candidate preempts (measured: a request paused in upstream's log while others "
                              f"went on, on {', '.join(dict.fromkeys(parking))})"), bool(base_ev)
    if cand_ev:
        return "eviction", (f"auto: the candidate evicts (measured: fewer requests terminated than were in play "
                            f"on {', '.join(dict.fromkeys(cand_ev))})" + base_note), bool(base_ev)
    return "no-regression", ("auto: the candidate does not evict on any overflow workload (measured), so it is "
                             "judged for no regression against the base"), bool(base_ev)


# The overflow workload that decides `--expect auto` when the judged list has none.
PROBE = "overflow-4"
# With a real model (`--model smollm2`): workloads of real text, sized in the model's own tokens.
REAL_SUITE = ["text-overflow-4"]
# The default suite, in the order that shows the most first. Every workload that kills a mutant or
# reaches a shape of the failure point (coverage.py) is here: a default PASS is the proof.
SUITE = ["overflow-4", "overflow-8", "overflow-nonstream", "staggered", "victim-first", "victim-middle",
         "victim-decoded", "victim-decoded-middle", "victim-straddled", "cells-not-prompt", "two-overflows", "two-slots", "prompt-victim",
         "prompt-victim-decoded", "prompt-survivor", "prompt-survivor-decoded", "prompt-survivor-full",
         "stateful-4", "swa-overflow-4", "hybrid-overflow-4", "fits", "single-slot", "park-whole-pool",
         "many-resumes-8", "park-starvation-7", "lora-resume-3", "park-arrivals-3", "ncmpl-survivor",
         "ncmpl-waiting-child"]


def resolve_candidate(repo: git.Repo, base: str, *, candidate_ref=None, patch_name=None, patch_file=None,
                      commit=None, policy="largest", variant=None, opts=build_mod.Options(),
                      progress=log_progress) -> tuple[str, str, str | None, str | None]:
    """(candidate commit, label, layout, source commit). With no option: the default patch on the base."""
    from . import apply as apply_mod
    from . import patch as patch_mod
    from .source import resolve

    if candidate_ref:
        sha = resolve(repo, candidate_ref)
        return sha, f"ref {candidate_ref}", None, sha
    if patch_file:
        return apply_mod.from_patch_file(repo, base, patch_file), f"patch file {Path(patch_file).name}", None, None
    if commit:
        sha = resolve(repo, commit)
        return apply_mod.from_commit(repo, base, sha), f"commit {sha[:12]} merged into base", None, sha
    name = patch_name or patch_mod.DEFAULT_PATCH
    sha, an = apply_mod.candidate_commit(repo, base, name, policy, variant, opts, progress)
    layout = an.facts.layout if an.facts else None
    return sha, f"patch {name}" + (f" (variant {variant})" if variant else ""), layout, None


# How far below HEAD (first parents) a patchkit series is still found: commits someone added on
# top of the patch branch (a README note, a fix) do not hide that HEAD carries the patch.
SERIES_DEPTH = 50


def choose_base(repo: git.Repo, base_ref: str | None, candidate_ref: str | None) -> tuple[str, str]:
    """(base commit, why). Without --base: the commit a patchkit series was applied on when the
    candidate (or HEAD) carries such a series, else HEAD."""
    from .apply import series_base
    from .source import resolve

    cand = resolve(repo, candidate_ref) if candidate_ref else None
    if base_ref is not None:
        return resolve(repo, base_ref), f"--base {base_ref}"
    carrier = cand or resolve(repo, None)
    # a candidate you name may have commits on top of its series; HEAD is read as it is
    under = series_base(repo, carrier, within=SERIES_DEPTH if cand else 0)
    if under:
        return under, (f"the commit {candidate_ref or 'HEAD'} was patched on "
                       "(it carries a patchkit series; --base overrides)")
    return resolve(repo, None), "HEAD"


def refuse_vacuous(repo: git.Repo, base: str, base_why: str, cand: str, cand_why: str) -> None:
    """Judging a commit against itself, or against another commit of the same tree (the same
    binary), proves nothing: refused before anything is built."""
    same = "the same commit" if cand == base else (
        "two commits with the same tree (one binary)" if repo.commit(cand).tree == repo.commit(base).tree else None)
    if same:
        from .apply import series_base
        deeper = series_base(repo, base, within=SERIES_DEPTH)
        hint = (f" {base[:12]} already carries a patchkit series: to judge it "
                f"against the commit under the series ({deeper[:12]}), pass --candidate {base[:12]} (or its "
                f"branch).") if deeper else ""
        raise UsageError(
            f"the base and the candidate are {same} ({base[:12]}: base from {base_why}; candidate "
            f"{cand[:12]}: {cand_why}); verify would judge one server against itself, a verdict on nothing. "
            f"Pass the commit the change was made on as --base (e.g. --base main), or the changed commit as "
            f"--candidate." + hint)


def series_patch(repo: git.Repo, commit: str) -> str | None:
    """The patch family a patchkit series below `commit` was rendered from (its trailer); None
    when no commit names one of the families this patchkit has."""
    found = promises.trailer(repo, None, commit, SERIES_DEPTH)
    return found[0] if found else None


def verify(repo: git.Repo, *, base_ref=None, candidate_ref=None, patch_name=None, patch_file=None, commit=None,
           baseline_only=False, policy="largest", variant=None, workloads: list[Workload], repeat=1,
           out_dir: Path, ui, opts: build_mod.Options = build_mod.Options(), model_name: str | None = None,
           expect: str = "auto", promises_file: Path | None = None, fail_fast: bool = False) -> Result:
    from . import patch as patch_mod
    from .apply import series_base
    from .source import current_branch, resolve

    if not (baseline_only or candidate_ref or patch_name or patch_file or commit or variant or base_ref) \
            and series_base(repo, resolve(repo, None)):
        # HEAD is a patchkit series (`apply` made it): judge what the user has, not a re-rendering
        candidate_ref = "HEAD"
    base, why = choose_base(repo, base_ref, candidate_ref)
    ui.say(f"base {base[:12]}: {why}")
    cand, label, layout, src = None, "", None, None
    prep: tuple[tuple[str, float], ...] = ()
    if not baseline_only:
        t = time.monotonic()
        with ui.step("prepare candidate"):
            cand, label, layout, src = resolve_candidate(repo, base, candidate_ref=candidate_ref, patch_name=patch_name,
                                                    patch_file=patch_file, commit=commit, policy=policy,
                                                    variant=variant, opts=opts, progress=ui.say)
        if candidate_ref == "HEAD":
            branch = current_branch(repo)
            label = f"HEAD{f' (branch {branch})' if branch else ''}, which carries a patchkit series"
        prep = (("prepare candidate", time.monotonic() - t),)
        refuse_vacuous(repo, base, why, cand, label)
        ui.say(f"candidate {cand[:12]}: {label}" + (f", layout {layout}" if layout else ""))
    # what the candidate promises beyond the property: declared, its trailer, or its code (promises.py)
    declared = None
    if cand:
        declared = promises.of_candidate(repo, base, cand, declared=promises_file, policy=policy, within=SERIES_DEPTH,
                                         family=promises.rendered_family(patch_name, candidate_ref, patch_file, commit))
        ui.say("promises: " + (declared.text if declared else "none found (no declaration, trailer or patchkit code): "
                               "judged on the property alone"))
    with ui.step("builds and workloads"):
        family = declared.family if declared else ""
        spec = patch_mod.load_patch(family) if family else None
        res = run_suite(repo, base, cand, workloads, repeat=repeat, work_dir=out_dir / "logs", opts=opts,
                        policy=declared.policy if declared else policy, candidate_label=label, candidate_source=src,
                        layout=layout, model_name=model_name, expect=expect, evicting_patch=declared is not None,
                        say=ui.say, progress=ui.progress, patch_expect=declared.expect if declared else "eviction",
                        shapes=spec.shapes if spec else None, pairs=spec.pairs if spec else None,
                        family=family, declared=declared, fail_fast=fail_fast)
    return replace(res, timings=prep + res.timings, base_why=why)
