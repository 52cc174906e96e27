"""`patchkit export`: the series as a maintainer receives it, with the numbers that prove it.

Writes `git format-patch` files of the series (base..candidate) and a pull-request description
(toolkit/templates/pr.md.j2) built ONLY from measurements taken in this run: the before/after
table of the suite and of the model-family workloads, the property harness's batch count, the
mutation score (when a campaign's mutants.json is given), the sanitizer result (when asked
for), and the command that reproduces each figure. A figure that was not measured in this run
is said to be not measured; nothing is carried over from memory.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

import git
import jinja2

from . import apply as apply_mod
from . import build as build_mod
from . import check as check_mod
from . import patch as patch_mod
from . import report as report_mod
from . import verify as verify_mod
from .errors import PatchError, UsageError
from .workload import load as load_workload

FAMILIES = ["swa-overflow-4", "hybrid-overflow-4"]
TEMPLATES = jinja2.Environment(loader=jinja2.PackageLoader("toolkit", "templates"), undefined=jinja2.StrictUndefined,
                               trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


@dataclass(frozen=True)
class Exported:
    out_dir: Path
    patches: tuple[Path, ...]
    description: Path
    ok: bool                     # every figure the description states passed
    tip: str = ""                # the exported series' last commit (the candidate plus its own test)
    own_test: "OwnTest | None" = None


# The series' own server test, in upstream's style (its ServerPreset and utils helpers), added as
# the series' last commit: maintainers ask for a test under tools/server/tests/unit with any
# server change (issue 36). `patchkit upstream-tests --tests unit/test_kv_full.py` runs it on both sides.
OWN_TEST = "tools/server/tests/unit/test_kv_full.py"
OWN_TEST_SUBJECT = "server : test that a full unified KV cache {what}"


@dataclass(frozen=True)
class OwnTest:
    path: str
    base: str        # passed | failed | error | skipped | not run
    base_message: str
    candidate: str
    candidate_message: str

    @property
    def ok(self) -> bool:
        """It shows the change: it fails on the base and passes on the series."""
        return self.base in ("failed", "error") and self.candidate == "passed"


def own_test_text(repo: git.Repo, commit: str, promise: str) -> str:
    tree = repo.commit(commit).tree
    return render_own_test(promise, (tree / "tools/server/tests/utils.py").data_stream.read().decode(errors="replace"),
                           (tree / "common/arg.cpp").data_stream.read().decode(errors="replace"))


def render_own_test(promise: str, utils_py: str, arg_cpp: str) -> str:
    """The test rendered for a tree: its ServerProcess knows `kv_unified` (C2, D), or the test sets
    the environment variable the tree's --kv-unified reads (older trees: LLAMA_ARG_KV_SPLIT)."""
    import re
    m = re.search(r'"--kv-unified".{0,800}?\.set_env\("(\w+)"\)', arg_cpp, re.S)
    return TEMPLATES.get_template("upstream_test_kv_full.py.j2").render(
        promise=promise, kvu_field=bool(re.search(r"^\s+kv_unified:", utils_py, re.M)),
        kvu_env=m.group(1) if m else "LLAMA_ARG_KV_UNIFIED")


def add_own_test(repo: git.Repo, candidate: str, promise: str) -> str:
    what = "ends only the largest request" if promise == "one-victim" else "completes every request"
    msg = (OWN_TEST_SUBJECT.format(what=what) + "\n\n"
           "Four requests that each fit, and any three of which fit together, outgrow a unified KV cache\n"
           f"of four slots together. The test asserts that the server {what}, and serves on.\n")
    return apply_mod.commit_text(repo, candidate, OWN_TEST, own_test_text(repo, candidate, promise).encode(), msg)


def write_patches(repo: git.Repo, base: str, tip: str, out_dir: Path) -> tuple[Path, ...]:
    """The series as `git am` takes it. The trailers are patchkit's bookkeeping, not the
    maintainer's: format-patch keeps the messages as committed, so they are stripped from the
    files (the series' promises then come from its code: promises.recognise)."""
    names = repo.git.format_patch(f"{base}..{tip}", "-o", str(out_dir), "--no-signature").splitlines()
    patches = tuple(Path(n) for n in names)
    for p in patches:
        p.write_text("\n".join(l for l in p.read_text().splitlines() if not l.startswith("Patchkit-")) + "\n")
    return patches


def run_own_test(repo: git.Repo, base: str, tip: str, out_dir: Path, say, progress) -> OwnTest:
    from . import upstream as upstream_mod
    res = upstream_mod.run(repo, base, tip, tests=(OWN_TEST.removeprefix("tools/server/tests/"),),
                           out_dir=out_dir, say=say, progress=progress)
    got = {}
    for r in res.runs:
        o = r.outcomes[0] if r.outcomes else None
        got[r.side] = (o.outcome, o.message) if o else ("not run", f"pytest exit {r.rc}, no junit record")
    return OwnTest(OWN_TEST, *got.get("base", ("not run", "")), *got.get("candidate", ("not run", "")))


def export(repo: git.Repo, base: str, candidate: str, out_dir: Path, *, repo_arg: str, mutants_json: Path | None,
           sanitize: bool, repeat: int, say, progress, patch_name: str | None = None) -> Exported:
    """`patch_name`: the family the series was rendered from (default: its commits' trailer, else
    the eviction); its expectations and shapes judge the runs."""
    from .verify import series_patch
    spec = patch_mod.load_patch(patch_name or series_patch(repo, candidate) or patch_mod.DEFAULT_PATCH)
    if base == candidate:
        raise UsageError("the series is empty: base and candidate are the same commit.")
    commits = list(repo.iter_commits(f"{base}..{candidate}", first_parent=True))
    if not commits:
        raise UsageError(f"{candidate[:12]} is not a descendant of {base[:12]}: nothing to export.")
    # a campaign on another base is refused before anything is written or run
    try:
        mutants = json.loads(mutants_json.read_text()) if mutants_json else None
    except (OSError, ValueError) as e:
        raise UsageError(f"{mutants_json} is not a readable mutants.json ({e}).")
    if mutants and mutants.get("base") != base:
        raise UsageError(f"{mutants_json} is a campaign on {str(mutants.get('base'))[:12]}, not on this base "
                         f"{base[:12]}: run `patchkit mutants` on this base.")
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.patch"):
        old.unlink()
    # the series' own upstream-style test, its last commit (unless the series already has it)
    promise = "preemption" if spec.expect == "preemption" else "one-victim"
    has_test = any(OWN_TEST in c.stats.files for c in commits)
    tip = candidate if has_test else add_own_test(repo, candidate, promise)
    commits = list(repo.iter_commits(f"{base}..{tip}", first_parent=True))
    patches = write_patches(repo, base, tip, out_dir)
    stat = repo.git.diff("--stat", base, candidate)

    def cmd(*args: str) -> str:
        return "patchkit " + " ".join(shlex.quote(a) for a in args)

    say("measuring: the default suite, base vs the series")
    suite = verify_mod.run_suite(repo, base, candidate, [load_workload(w) for w in verify_mod.SUITE], repeat=repeat,
                                 work_dir=out_dir / "logs" / "suite", expect=spec.expect, evicting_patch=True,
                                 candidate_label="the series", say=say, progress=progress,
                                 patch_expect=spec.expect, shapes=spec.shapes, family=spec.name)
    # the model-family workloads are in the default suite: their section shows the suite's runs of them
    families = replace(suite, results=tuple(r for r in suite.results if r.workload.name in FAMILIES),
                       coverage=())  # the suite's coverage is the suite's: not repeated under two workloads
    an = apply_mod.analyze(repo, base, spec, progress=progress)  # facts cached: no parse again
    layout = an.facts.layout if an.facts else None
    prop = None
    try:
        say("measuring: the property harness")
        prop = check_mod.property_check(repo, candidate, progress=progress)
    except PatchError as e:
        say(f"  property harness not run: {e}")
    san = None
    # the TUs the series changes and the KV cache they free cells in; the rest is the plain build's
    san_scope = tuple(f for f in repo.git.diff("--name-only", base, candidate).split()
                      if f.endswith((".c", ".cpp"))) + build_mod.KV_CACHE_SOURCES
    if sanitize:
        say(f"measuring: the suite's overflow workloads with ASan+UBSan on {', '.join(san_scope)}")
        san = verify_mod.run_suite(repo, base, candidate, [load_workload(w) for w in ("overflow-4", "victim-first")],
                                   work_dir=out_dir / "logs" / "sanitize", expect=spec.expect, evicting_patch=True,
                                   patch_expect=spec.expect, family=spec.name,
                                   opts=build_mod.Options(sanitize=("address", "undefined"), sanitize_only=san_scope),
                                   candidate_label="the series", say=say, progress=progress)
    say(f"measuring: the series' own test ({OWN_TEST}), base vs the series")
    own = run_own_test(repo, base, tip, out_dir / "logs" / "own-test", say, progress)
    subject = commits[-1].summary      # the series' first commit (the test is its last)
    ctx = {
        "subject": subject, "base": base, "candidate": candidate, "commits": list(reversed(commits)), "stat": stat,
        "layout": layout, "suite": suite, "families": families, "prop": prop, "san": san, "mutants": mutants,
        "table": report_mod.text_table, "repeat": repeat,
        "cmd_suite": cmd("verify", "--repo", repo_arg, "--base", base[:12], "--candidate", candidate[:12],
                         "--repeat", str(repeat)),
        "cmd_families": cmd("verify", "--repo", repo_arg, "--base", base[:12], "--candidate", candidate[:12],
                            *sum((["--workload", w] for w in FAMILIES), []), "--repeat", str(repeat)),
        "cmd_property": cmd("check", "--repo", repo_arg, "--ref", candidate[:12], "--property"),
        "cmd_sanitize": cmd("verify", "--repo", repo_arg, "--base", base[:12], "--candidate", candidate[:12],
                            "--sanitize", "address,undefined", *sum((["--sanitize-only", f] for f in san_scope), []),
                            "--workload", "overflow-4", "--workload", "victim-first"),
        "san_scope": san_scope,
        "cmd_mutants": cmd("mutants", "--repo", repo_arg, "--base", base[:12]),
        "own": own, "cmd_own": cmd("upstream-tests", "--repo", repo_arg, "--base", base[:12], "--candidate", tip[:12],
                                   "--tests", OWN_TEST.removeprefix("tools/server/tests/")),
    }
    desc = out_dir / "PR.md"
    desc.write_text(TEMPLATES.get_template("pr.md.j2").render(**ctx))
    ok = suite.ok and families.ok and (prop is None or prop.ok) and (san is None or san.ok) and own.ok
    return Exported(out_dir, patches, desc, ok, tip, own)
