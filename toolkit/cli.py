"""The `patchkit` command: a thin click layer over the library.

Every command prints progress on stderr and its result on stdout (the last line is the
path or verdict a script wants); --json prints one JSON document instead. Errors are
PatchkitError subclasses, each with its own exit code (docs/exit-codes.md).
"""
from __future__ import annotations

import json
import logging
import signal
import sys
import time
from pathlib import Path

import click

from . import build as build_mod
from . import model as model_mod
from . import proc, source, workload
from .errors import EXIT_CODES, Interrupted, PatchkitError, ReportError, UsageError
from .ui import UI, help_list
from .compare import EXPECTATIONS
from .patch import all_policies

POLICIES = all_policies()


def _sigterm(signum, frame):
    raise KeyboardInterrupt()


def main() -> None:
    # Started in the background (`cmd &` in a script, some nohup/CI launchers), SIGINT arrives
    # ignored (SIG_IGN is inherited) and Python then installs no KeyboardInterrupt handler: a
    # Ctrl-C or `kill -INT` would do nothing and children would outlive us. Always take it, so it
    # reaches the cleanup below (children run in their own process groups: proc.py kills them).
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _sigterm)
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(UsageError.exit_code)
    except click.exceptions.Abort:
        proc.stop_all()
        print("patchkit: interrupted; stopped all child processes.", file=sys.stderr)
        sys.exit(Interrupted.exit_code)
    except KeyboardInterrupt:
        proc.stop_all()
        print("patchkit: interrupted; stopped all child processes, your tree is untouched.", file=sys.stderr)
        sys.exit(Interrupted.exit_code)
    except PatchkitError as e:
        proc.stop_all()
        print(e.render(), file=sys.stderr)
        sys.exit(e.exit_code)
    except Exception as e:  # a bug: never exit 1, which means "an expectation failed"
        proc.stop_all()
        logging.getLogger("patchkit").debug("internal error", exc_info=True)
        print(f"patchkit: internal error: {type(e).__name__}: {e} (run with -v for the traceback; "
              "please report it).", file=sys.stderr)
        sys.exit(PatchkitError.exit_code)
    finally:
        proc.stop_all()


def _emit_json(data) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def _repo(path: str | None, ui: UI):
    """--repo, or the embedded default tree (fetched on first use)."""
    if path:
        return source.open_repo(path)
    tree = source.fetch(progress=ui.say)
    return source.open_repo(tree.path)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="patchkit")
@click.option("-v", "--verbose", is_flag=True, help="Log every external command.")
def cli(verbose: bool) -> None:
    """Prove llama-server changes on real llama.cpp trees.

    \b
    The flow is one way:  source -> apply -> build -> verify -> pin / repro
      patchkit source fetch             get the default llama.cpp tree (C2 layout)
      patchkit apply --repo R           put the eviction patch on a new branch
      patchkit build --repo R           build llama-server (cached by tree content)
      patchkit verify --repo R          base vs patched on real overflow workloads
      patchkit demo                     all of the above on the default tree
    Exit codes: see `patchkit exit-codes`.
    """
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(name)s: %(message)s", stream=sys.stderr)


@cli.command("exit-codes")
def exit_codes() -> None:
    """List every exit code and what it means."""
    for code, text in sorted(EXIT_CODES.items()):
        click.echo(f"{code:4d}  {' '.join((text or '').split())}")


@cli.group("source")
def source_group() -> None:
    """Obtain llama.cpp trees (PyPI sdists of llama-cpp-python / ik-llama-cpp-python)."""


@source_group.command("fetch")
@click.option("--package", default=source.DEFAULT_PACKAGE, show_default=True,
              type=click.Choice(list(source.PACKAGES)), help="Which sdist carries the tree.")
@click.option("--version", "version", default=source.DEFAULT_VERSION, show_default=True,
              help="Package version: 0.3.16 (layout A), 0.3.28 (B), 0.3.32 (C), 0.3.35 (C2), 0.3.36 (D).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of the path.")
def source_fetch(package: str, version: str, as_json: bool) -> None:
    """Download an sdist, extract vendor/llama.cpp into the cache as a git repo; print its path.

    A second call is instant. Example: patchkit source fetch --version 0.3.36
    """
    ui = UI(quiet=as_json)
    t = time.monotonic()
    tree = source.fetch(package, version, progress=ui.say)
    ui.say(f"{'fetched' if tree.fetched else 'cached'}: {package} {version} at {tree.commit[:12]} "
           f"({time.monotonic() - t:.1f} s)")
    if as_json:
        _emit_json({"package": package, "version": version, "path": str(tree.path), "commit": tree.commit,
                    "fetched": tree.fetched})
    else:
        click.echo(str(tree.path))


@cli.command("model")
@click.option("--arch", "arch", type=click.Choice(sorted(model_mod.FAMILIES)), default="tiny", show_default=True,
              help="Which tiny family: tiny (llama), or another attention/memory layout (docs/commands.md, model).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Where to write (default: cache).")
@click.option("--draft", is_flag=True, help="The draft model (same vocabulary) for speculative decoding.")
def model_cmd(arch: str, out: Path | None, draft: bool) -> None:
    """Write a tiny deterministic GGUF (same bytes every run); print sha256 and path.

    \b
    Examples:
      patchkit model                      # the default tiny llama
      patchkit model --arch gemma2        # sliding-window attention (iSWA cache)
    """
    m = model_mod.ensure(model_mod.DRAFT if draft else model_mod.FAMILIES[arch], out)
    click.echo(f"sha256 {m.sha256}  ({m.path.stat().st_size} bytes, {m.n_vocab} tokens)")
    click.echo(str(m.path))


def _build_options(sanitize: str | None, build_dir: Path | None, only: tuple[str, ...] = ()) -> build_mod.Options:
    san = tuple(s.strip() for s in sanitize.split(",") if s.strip()) if sanitize else ()
    if only and not san:
        raise UsageError("--sanitize-only scopes a sanitizer build: give --sanitize too (e.g. --sanitize "
                         "address,undefined --sanitize-only 'tools/server/*').")
    return build_mod.Options(sanitize=san, sanitize_only=tuple(only), workdir=build_dir)


SANITIZE_ONLY_HELP = ("Instrument only sources matching this repo-relative glob (repeatable), e.g. 'tools/server/*': "
                      "the rest is the plain build's, served by ccache (minutes instead of ~20 min cold).")


@cli.command("build")
@click.option("--repo", type=click.Path(file_okay=False), help="llama.cpp checkout (default: the fetched tree).")
@click.option("--ref", default=None, help="Commit/branch/tag to build (default HEAD). Built in a private "
              "work tree: your checkout, branch and index are never touched.")
@click.option("--build-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Workspace root (src/ + build/) instead of the cache.")
@click.option("--sanitize", default=None, help="address,undefined: the tree's own LLAMA_SANITIZE_* options.")
@click.option("--sanitize-only", "sanitize_only", multiple=True, metavar="GLOB", help=SANITIZE_ONLY_HELP)
@click.option("--json", "as_json", is_flag=True)
def build_cmd(repo, ref, build_dir, sanitize, sanitize_only, as_json) -> None:
    """Build llama-server (CMake + Ninja, offline flags, compile_commands.json); print the binary path.

    A finished build is reused when tree content and flags are unchanged.
    Example: patchkit build --repo ~/llama.cpp --ref my-branch
    """
    ui = UI(quiet=as_json)
    opts = _build_options(sanitize, build_dir, sanitize_only)
    r = _repo(repo, ui)
    with ui.step("build llama-server"):
        built = build_mod.build(r, ref, opts, progress=ui.progress)
    ui.say(f"{'reused cached build' if built.reused else f'built in {built.seconds:.1f} s'} "
           f"(commit {built.commit[:12]}, compile_commands: {built.workspace.compile_commands})")
    if as_json:
        _emit_json({"binary": str(built.binary), "commit": built.commit, "tree": built.tree,
                    "reused": built.reused, "seconds": round(built.seconds, 2),
                    "compile_commands": str(built.workspace.compile_commands), "log": str(built.workspace.log)})
    else:
        click.echo(str(built.binary))


@cli.command("verify")
@click.option("--repo", type=click.Path(file_okay=False), help="llama.cpp checkout (default: the fetched tree).")
@click.option("--base", "base_ref", default=None, help="Base ref. Default: the commit a patchkit series was applied "
              "on when the candidate (or HEAD) is one; else HEAD (the baseline tag on the fetched tree). A base equal to "
              "the candidate is refused.")
@click.option("--candidate", "cand_ref", default=None, help="Candidate: an existing ref (e.g. your patched branch).")
@click.option("--patch", "patch_name", default=None, help="Candidate: this patch applied to the base (the default: "
              "evict-largest-slot), in a private work tree.")
@click.option("--patch-file", type=click.Path(dir_okay=False, path_type=Path), help="Candidate: a .patch/.diff "
              "applied to the base.")
@click.option("--commit", "commit_sha", default=None, help="Candidate: a commit merged into the base, as a fork's "
              "nightly merges a pinned PR commit.")
@click.option("--policy", type=click.Choice(POLICIES), default="largest", show_default=True,
              help="Whom the patch chooses (not-leader-smallest: the preemption patches only).")
@click.option("--variant", default=None, hidden=True, help="A deliberately broken rendering (oracle self-test).")
@click.option("--baseline-only", is_flag=True, help="Run the workloads on the base only (show the bug).")
@click.option("--workload", "workloads", multiple=True,
              help="Workload name or .toml path; repeatable (default: the suite)." + help_list(workload.available(), "Known:"))
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 50), help="Runs per workload and side.")
@click.option("--report-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where report.json/md/html and server logs go (default: ./patchkit-report).")
@click.option("--sanitize", default=None, help="Build both sides with address,undefined (the tree's own "
              "LLAMA_SANITIZE_* options); any sanitizer report fails the run.")
@click.option("--sanitize-only", "sanitize_only", multiple=True, metavar="GLOB", help=SANITIZE_ONLY_HELP)
@click.option("--model", "model_name", default=None, help="Serve this model for every workload: a tiny family "
              f"({', '.join(model_mod.FAMILIES)}), a real one ({', '.join(model_mod.REAL)}: downloaded from PyPI "
              "once), or a path to any GGUF. Default: each workload's own.")
@click.option("--expect", type=click.Choice(["auto", *EXPECTATIONS]), default="auto",
              show_default=True,
              help="Which expectations judge the candidate. eviction: base shows the bug, candidate evicts one "
              "(victim, survivors, integrity). preemption: no request fails, every stream equals its control, "
              "every cell comes back, no wait while nothing runs. no-regression: no request does worse than on "
              "the base, server healthy (any other change). auto: what patchkit's patch promises, or what the "
              "candidate measurably does (parks -> preemption, evicts -> eviction), else no-regression; the "
              "report says which applied and why.")
@click.option("--json", "as_json", is_flag=True, help="Print report.json to stdout, no progress.")
@click.option("--upstream-tests", "upstream_tests", multiple=True, help="Also run llama.cpp's own server tests "
              "(tools/server/tests) on both sides, offline: a subset name (`ci`), a file or a test id; repeatable. "
              "A test that passes on the base and fails on the candidate fails the verdict (see upstream-tests).")
def verify_cmd(repo, base_ref, cand_ref, patch_name, patch_file, commit_sha, policy, variant, baseline_only,
               workloads, repeat, report_dir, sanitize, sanitize_only, model_name, expect, as_json,
               upstream_tests) -> None:
    """Build base and candidate, run overflow workloads on both, judge every slot's outcome.

    Exit 0 when every expectation holds, 1 when one fails (report says which).

    \b
    Examples:
      patchkit verify                                         # default tree, default patch, suite
      patchkit verify --repo ~/llama.cpp --baseline-only --workload overflow-4
      patchkit verify --repo ~/llama.cpp --candidate patchkit/evict-largest-slot --repeat 3
                                                              # base: the commit the series was applied on
      patchkit verify --repo ~/llama.cpp --commit 59a3d0cb8f61 --report-dir out/
    """
    from . import report
    from . import verify as pipeline

    ui = UI(quiet=as_json)
    chosen = [x for x in (cand_ref, patch_name, patch_file, commit_sha) if x]
    if len(chosen) > 1:
        raise UsageError("give at most one of --candidate, --patch, --patch-file, --commit.")
    if baseline_only and chosen:
        raise UsageError("--baseline-only runs no candidate; drop the candidate option.")
    r = _repo(repo, ui)
    if base_ref is None and not repo:
        base_ref = source.BASELINE_TAG
    default = pipeline.REAL_SUITE if model_name in model_mod.REAL else pipeline.SUITE
    wls = [workload.load(w) for w in (workloads or (["overflow-4"] if baseline_only else default))]
    out_dir = (report_dir or Path("patchkit-report")).resolve()
    res = pipeline.verify(r, base_ref=base_ref, candidate_ref=cand_ref, patch_name=patch_name,
                          patch_file=patch_file, commit=commit_sha, baseline_only=baseline_only, policy=policy,
                          variant=variant, workloads=wls, repeat=repeat, out_dir=out_dir, ui=ui,
                          opts=_build_options(sanitize, None, sanitize_only), model_name=model_name,
                          expect=expect)
    paths = report.write(res, out_dir)
    up = None
    if upstream_tests and res.candidate_commit:
        from . import upstream
        with ui.step("upstream server tests, base vs candidate"):
            up = upstream.run(r, res.base_commit, res.candidate_commit, candidate_label=res.candidate_label,
                              tests=upstream_tests, repeat=1, out_dir=out_dir / "upstream", say=ui.say,
                              progress=ui.progress, opts=_build_options(sanitize, None, sanitize_only))
        upstream.write(up, out_dir / "upstream")
    ok = res.ok and (up is None or up.ok)
    if as_json:
        _emit_json({**report.to_json(res), "ok": ok,
                    "upstream": upstream.to_json(up) if up else None})
    else:
        click.echo(report.text_table(res))
        if up:
            click.echo(upstream.text_summary(up))
        click.echo(f"reports: {paths['md']} {paths['html']} {paths['json']}"
                   + (f" {out_dir / 'upstream' / 'upstream.json'}" if up else ""))
        click.echo("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


@cli.command("mutants")
@click.option("--repo", type=click.Path(file_okay=False), help="llama.cpp checkout (default: the fetched tree).")
@click.option("--base", "base_ref", default=None, help="The unpatched base (default: HEAD; the baseline tag on the "
              "fetched tree).")
@click.option("--patch", "patch_name", default="evict-largest-slot", show_default=True,
              help="Whose catalog: the eviction patch's mutants, or a preemption patch's broken variants "
              "(park-slot, recompute-slot), each judged by that patch's own expectations.")
@click.option("--mutant", "names", multiple=True, help="A mutant of the catalog; repeatable (default: all).")
@click.option("--workload", "workloads", multiple=True, help="Workload name or .toml path; repeatable (default: "
              "the default suite plus the campaign's separating workloads).")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 50), help="Runs per workload.")
@click.option("--report-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where mutants.json and the server logs go (default: ./patchkit-mutants).")
@click.option("--list", "list_only", is_flag=True, help="Print the catalog and exit.")
@click.option("--operators", "operators", is_flag=True, help="Mutants nobody designed: classic mutation operators "
              "(relational, arithmetic, logical, constants, negated conditions, deleted statements) on every line "
              "the patch adds, all compiled into ONE schema binary and selected at run time; each judged by the "
              "suite, stopping at its first failed check.")
@click.option("--sample", "sample_n", default=None, type=click.IntRange(1, 100000), help="With --operators: a "
              "seeded random sample of this many mutants.")
@click.option("--seed", default=0, show_default=True, help="With --sample: the sample's seed.")
@click.option("--shard", "shard", default="1/1", show_default=True, help="With --operators: K/N, this job's share "
              "(every N-th mutant from the K-th) of a campaign split over a CI matrix.")
@click.option("--json", "as_json", is_flag=True)
def mutants_cmd(repo, base_ref, patch_name, names, workloads, repeat, report_dir, list_only, operators, sample_n,
                seed, shard, as_json) -> None:
    """Run the mutation campaign: how many wrong patches does the verdict kill?

    Each mutant is the rendered eviction patch with one edit (a wrong victim
    quantity, the batch surgery skipped or off by one, two victims, the victim's cells kept,
    a guard inverted...; patches/evict-largest-slot/patch.toml). Each is built on the base
    (one TU on the shared build) and judged as a candidate: static checks, the C++ property
    harness, the workload suite. Prints mutant -> killed (by which check, where, why) or
    ALIVE, and the mutation score. Exit 0 when every mutant not claimed equivalent is
    killed, 1 otherwise.

    \b
    Examples:
      patchkit mutants --list
      patchkit mutants                                   # default tree, whole catalog
      patchkit mutants --repo T --mutant victim-by-prompt --mutant entries-kept --json
      patchkit mutants --patch park-slot --repeat 3       # the preemption patch's broken variants
    """
    from dataclasses import asdict

    from . import mutate
    from . import verify as pipeline

    from . import patch as patch_mod

    patch_mod.load_patch(patch_name)  # an unknown name is refused with the known ones
    cat = mutate.catalog(patch_name)
    if list_only:
        for n, m in cat.items():
            click.echo(f"{n:22} {m.get('class', ''):18} killer {m.get('killer', '-'):24} {m.get('what', '')}")
        return
    ui = UI(quiet=as_json)
    r = _repo(repo, ui)
    if base_ref is None and not repo:
        base_ref = source.BASELINE_TAG
    base = source.resolve(r, base_ref)
    default = mutate.PREEMPTION_WORKLOADS if patch_mod.load_patch(patch_name).expect == "preemption" \
        else pipeline.SUITE
    wls = [workload.load(w) for w in (workloads or default)]
    out_dir = (report_dir or Path("patchkit-mutants")).resolve()
    if operators:
        try:
            k, n = (int(x) for x in shard.split("/"))
            assert 1 <= k <= n
        except (ValueError, AssertionError):
            raise UsageError(f"--shard takes K/N with 1 <= K <= N (e.g. 2/4), not '{shard}'.")
        camp = mutate.operator_campaign(r, base, wls, sample_n=sample_n, seed=seed, shard=(k, n),
                                        out_dir=out_dir / "logs", say=ui.say, progress=ui.progress,
                                        patch_name=patch_name)
        doc = {"base": base, "schema_commit": camp.schema_commit, "generated": camp.generated,
               "duplicates": camp.duplicates, "stillborn": list(camp.stillborn), "killed": camp.killed,
               "alive": len(camp.alive), "schema_build_s": round(camp.schema_build_s, 1),
               "seconds": round(camp.seconds, 1), "mutants": [asdict(x) for x in camp.results]}
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "operators.json").write_text(json.dumps(doc, indent=2))
        _emit_json(doc) if as_json else click.echo(mutate.operator_table(camp))
        sys.exit(0 if not camp.alive else 1)
    res = mutate.campaign(r, base, list(names or cat), wls, repeat=repeat, out_dir=out_dir / "logs", say=ui.say,
                          progress=ui.progress, patch_name=patch_name)
    killed, judged = mutate.score(res)
    doc = {"base": base, "score": {"killed": killed, "judged": judged}, "mutants": [asdict(x) for x in res]}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "mutants.json").write_text(json.dumps(doc, indent=2))
    if as_json:
        _emit_json(doc)
    else:
        click.echo(mutate.table(res))
    sys.exit(0 if killed == judged else 1)


@cli.command("referee")
@click.option("--repo", type=click.Path(file_okay=False), help="llama.cpp checkout (default: the fetched tree).")
@click.option("--base", "base_ref", default=None, help="The unpatched base (default: HEAD; the baseline tag on the "
              "fetched tree).")
@click.option("--strategy", "strategies", multiple=True, help="STRATEGY[:POLICY], repeatable: base, terminate, park "
              "(swap to host memory), recompute; policies largest, smallest, newest, not-leader-smallest. Default: "
              "base, terminate:largest, park:largest|smallest|not-leader-smallest, recompute:largest|smallest.")
@click.option("--workload", "workloads", multiple=True, help="Workload name or .toml path; repeatable (default: "
              "overflow-4, staggered, overflow-8, staggered-8: 4 and 8 chats, together and staggered).")
@click.option("--model", "model_name", default=None, help="Serve this model for every workload (e.g. smollm2).")
@click.option("--candidate", "cand_refs", multiple=True, metavar="REF", help="Also a row for this ref of --repo "
              "(a fork's PR branch), repeatable: judged by what it measurably does (it parks -> the preemption "
              "expectations, it evicts -> the eviction ones, else no regression).")
@click.option("--candidate-env", "cand_envs", multiple=True, metavar="REF=NAME=VALUE", help="An environment "
              "variable for that candidate's servers (a knob the PR reads), repeatable.")
@click.option("--report-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("patchkit-referee"),
              show_default=True, help="Where report.json/md/html (table and chart) and the server logs go.")
@click.option("--json", "as_json", is_flag=True)
def referee_cmd(repo, base_ref, strategies, workloads, model_name, cand_refs, cand_envs, report_dir, as_json) -> None:
    """Referee every answer to a full KV cache on the same workloads: terminate, park, recompute.

    Each strategy is one patch family (patches/) with a victim policy, rendered on the base
    (one TU on the shared build) and run on the same workloads and model; the unpatched base
    and each workload's no-overflow control are run once and shared. Per strategy and workload:
    completed / total, collateral failures, makespan, aggregate tok/s, slowest request, parks,
    recomputed cells, longest pause, most parks for one request, exactness against the control,
    and the strategy's own verdict (its expectations: eviction or preemption). Exit 0 when every
    patched strategy passes its own expectations, 1 otherwise.

    \b
    Examples:
      patchkit referee
      patchkit referee --strategy park:largest --strategy recompute:largest --workload overflow-4
      patchkit referee --model smollm2 --json
    """
    from . import referee as ref_mod

    ui = UI(quiet=as_json)
    r = _repo(repo, ui)
    if base_ref is None and not repo:
        base_ref = source.BASELINE_TAG
    base = source.resolve(r, base_ref)
    entries = ref_mod.parse(tuple(strategies) or ref_mod.DEFAULT)
    envs: dict[str, dict[str, str]] = {ref: {} for ref in cand_refs}
    for item in cand_envs:
        ref, _, kv = item.partition("=")
        name, eq, value = kv.partition("=")
        if ref not in envs or not name or not eq:
            raise UsageError(f"--candidate-env takes REF=NAME=VALUE for a ref given with --candidate, not '{item}'.")
        envs[ref][name] = value
    wls = [workload.load(w) for w in (workloads or ref_mod.DEFAULT_WORKLOADS)]
    out_dir = report_dir.resolve()
    table = ref_mod.referee(r, base, entries, wls, model_name=model_name, out_dir=out_dir / "logs", say=ui.say,
                            progress=ui.progress, candidates=tuple(envs.items()))
    paths = ref_mod.write(table, out_dir)
    if as_json:
        _emit_json(ref_mod.to_json(table))
    else:
        click.echo(ref_mod.markdown(table))
        click.echo("reports: " + " ".join(str(p) for p in paths.values()))
    sys.exit(0 if all(row.verdict != "FAIL" for row in table.rows) else 1)


@cli.command("export")
@click.option("--repo", type=click.Path(file_okay=False), help="llama.cpp checkout (default: the fetched tree).")
@click.option("--base", "base_ref", default=None, help="The commit the series goes on (default: the commit under "
              "the candidate's patchkit series).")
@click.option("--candidate", "cand_ref", default=None, help="The series' tip (default: HEAD when it carries a "
              "patchkit series; else the patch applied to the base as commit objects).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("patchkit-export"),
              show_default=True, help="Where the .patch files and PR.md go.")
@click.option("--patch", "patch_name", default=None, help="The family of the series (default: the one its commits "
              "name, else evict-largest-slot); with no series to export, the family rendered on the base.")
@click.option("--mutants", "mutants_json", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, help="A `patchkit mutants` campaign's mutants.json on the same base: its score goes in.")
@click.option("--sanitize", is_flag=True, help="Also run overflow workloads with ASan+UBSan on the TUs the series "
              "changes and the KV cache (the rest from the plain build: a few minutes cold).")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 10))
@click.option("--json", "as_json", is_flag=True)
def export_cmd(repo, base_ref, cand_ref, out_dir, patch_name, mutants_json, sanitize, repeat, as_json) -> None:
    """Export the series for upstream: format-patch files + a PR description of measured numbers.

    The description (PR.md) holds the commit message and figures measured in this very run:
    the before/after table of the default suite and of the model-family workloads, the
    property harness's batch count, the mutation score (--mutants) and the sanitizer result
    (--sanitize), each with the command that reproduces it. Exit 0 when every figure passed.

    \b
    Examples:
      patchkit export --repo ~/llama.cpp --out pr/            # HEAD = the patch branch
      patchkit mutants --repo T --report-dir m/ && patchkit export --repo T --mutants m/mutants.json
    """
    from . import export as export_mod
    from . import verify as pipeline
    from .apply import series_base

    ui = UI(quiet=as_json)
    r = _repo(repo, ui)
    head = source.resolve(r, None)
    cand = source.resolve(r, cand_ref) if cand_ref else None
    if cand is None and series_base(r, head):
        cand = head
    base = source.resolve(r, base_ref) if base_ref else (series_base(r, cand, within=pipeline.SERIES_DEPTH)
                                                         if cand else head)
    if base is None:
        raise UsageError(f"{cand_ref} carries no patchkit series: name the commit it goes on with --base.")
    if cand is None:
        from . import apply as apply_mod
        cand, _ = apply_mod.candidate_commit(r, base, patch_name or apply_mod.patch.DEFAULT_PATCH, progress=ui.say)
    pipeline.refuse_vacuous(r, base, "--base" if base_ref else "the series' base", cand, cand_ref or "the series")
    res = export_mod.export(r, base, cand, out_dir.resolve(), repo_arg=repo or str(r.working_tree_dir),
                            mutants_json=mutants_json, sanitize=sanitize, repeat=repeat, say=ui.say,
                            progress=ui.progress, patch_name=patch_name)
    if as_json:
        _emit_json({"ok": res.ok, "patches": [str(p) for p in res.patches], "description": str(res.description)})
    else:
        for p in res.patches:
            click.echo(str(p))
        click.echo(str(res.description))
        click.echo("PASS" if res.ok else "FAIL")
    sys.exit(0 if res.ok else 1)


@cli.command("apply")
@click.option("--repo", type=click.Path(file_okay=False), required=True, help="Your llama.cpp checkout.")
@click.option("--patch", "patch_name", default="evict-largest-slot", show_default=True,
              help="Patch folder under patches/.")
@click.option("--policy", type=click.Choice(POLICIES), default="largest",
              show_default=True, help="Whom the patch chooses: most cells, fewest cells, newest task "
              "(not-leader-smallest: the preemption families); each family lists its own in its patch.toml.")
@click.option("--branch", default=None, help="New branch for the series (default patchkit/<patch>).")
@click.option("--check", "dry", is_flag=True, help="Print the unified diff; write nothing.")
@click.option("--revert", is_flag=True, help="Return to the branch apply started from, and delete the patch branch "
              "when it holds only patchkit's commits (kept, and said so, when you committed on top).")
@click.option("--json", "as_json", is_flag=True)
def apply_cmd(repo, patch_name, policy, branch, dry, revert, as_json) -> None:
    """Apply the eviction patch as a commit series on a new branch, and check it out.

    The layout (A, B, C, C2, D) is read from the AST (libclang over compile_commands.json,
    configured on demand); anchors are found by meaning, never by line number. Your
    original branch does not move; a dirty tree is refused and left untouched.

    \b
    Examples:
      patchkit apply --repo ~/llama.cpp                 # new branch patchkit/evict-largest-slot
      patchkit apply --repo ~/llama.cpp --check         # show the diff only
      patchkit apply --repo ~/llama.cpp --revert        # back to where you were
    """
    from . import apply as apply_mod

    ui = UI(quiet=as_json)
    r = source.open_repo(repo)
    if revert:
        where, deleted = apply_mod.revert(r, branch)
        msg = f"back on {where}" + ("; patch branch deleted" if deleted else "; patch branch kept (it has your commits)")
        _emit_json({"status": "reverted", "to": where, "branch_deleted": deleted}) if as_json else click.echo(msg)
        return
    res = apply_mod.apply(r, patch_name=patch_name, policy=policy, branch=branch, check=dry, progress=ui.say)
    if as_json:
        _emit_json({"status": res.status, "layout": res.layout, "branch": res.branch, "base": res.base_commit,
                    "head": res.head_commit, "commits": list(res.commits), "file": res.file,
                    "seconds": round(res.seconds, 2), "diff": res.diff if dry else None})
    elif res.status == "checked":
        click.echo(res.diff, nl=False)
        ui.say(f"layout {res.layout}: diff above; nothing written (--check).")
    elif res.status == "already-applied":
        click.echo(f"already applied: {res.file} carries the patch at {res.base_commit[:12]}; nothing to do.")
    else:
        click.echo(f"applied to layout {res.layout} in {res.seconds:.1f} s: {len(res.commits)} commit(s) on "
                   f"branch {res.branch} (base {res.base_commit[:12]}), now checked out.")
        click.echo(res.head_commit)


@cli.command("check")
@click.option("--repo", type=click.Path(file_okay=False), required=True)
@click.option("--ref", default=None, help="The patched ref (default HEAD).")
@click.option("--patch", "patch_name", default=None, help="The family the ref carries (default: the one its "
              "series' commits name, else evict-largest-slot).")
@click.option("--property", "prop", is_flag=True, help="Also compile and run the C++ property harness: the "
              "patched batch surgery over random batches (needs the tree's libraries: builds once).")
@click.option("--iterations", default=20000, show_default=True, type=click.IntRange(1, 10_000_000))
@click.option("--json", "as_json", is_flag=True)
def check_cmd(repo, ref, patch_name, prop, iterations, as_json) -> None:
    """Compile only the patched server TU (its compile_commands.json line) and check the patch statically.

    Fails on a compile error, on any warning inside the patch's regions, or on a broken
    invariant (embd not compacted, token pointer not restored, indices not remapped).
    Example: patchkit check --repo ~/llama.cpp
    """
    from . import check as check_mod

    ui = UI(quiet=as_json)
    from . import patch as patch_mod
    from .verify import series_patch

    r = source.open_repo(repo)
    family = patch_name or series_patch(r, source.resolve(r, ref)) or patch_mod.DEFAULT_PATCH
    res = check_mod.check(r, ref, family, progress=ui.say)
    pres = check_mod.property_check(r, ref, iterations, progress=ui.say) if prop else None
    ok = res.ok and (pres is None or pres.ok)
    if as_json:
        _emit_json({"ok": ok, "commit": res.commit, "file": res.file, "errors": list(res.errors),
                    "new_warnings": list(res.new_warnings), "old_warnings": res.old_warnings,
                    "static": [c.__dict__ for c in res.static], "compile_s": round(res.compile_s, 2),
                    "property": None if pres is None else {"ok": pres.ok, "iterations": pres.iterations,
                                                           "output": pres.output}})
    else:
        click.echo(f"{res.file} at {res.commit[:12]}: compiled in {res.compile_s:.1f} s, "
                   f"{len(res.errors)} error(s), {len(res.new_warnings)} new warning(s) "
                   f"({res.old_warnings} pre-existing)")
        for e in res.errors + res.new_warnings:
            click.echo(f"  {e}")
        for c in res.static:
            click.echo(f"  {c.status:4s} {c.name}: {c.detail}")
        if pres is not None:
            click.echo(f"  {'pass' if pres.ok else 'fail'} property: {pres.output}")
        click.echo("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


@cli.command("demo")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 50))
@click.option("--report-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Default: ./patchkit-report")
@click.option("--model", "model_name", default=None, help="e.g. smollm2: a real model and its text workloads.")
@click.option("--json", "as_json", is_flag=True)
def demo_cmd(repeat, report_dir, model_name, as_json) -> None:
    """The whole job on the embedded default: fetch llama-cpp-python 0.3.35 (layout C2), write the
    tiny model, apply the patch (in a private work tree), build base and patched, run the suite,
    print the before/after table.

    Everything is cached (PATCHKIT_CACHE, default ~/.cache/patchkit): a second run is fast.
    Example: patchkit demo --repeat 3 --report-dir out/
    """
    from . import report
    from . import verify as pipeline

    ui = UI(quiet=as_json)
    with ui.step(f"fetch {source.DEFAULT_PACKAGE} {source.DEFAULT_VERSION}"):
        tree = source.fetch(progress=ui.say)
    with ui.step("tiny model"):
        m = model_mod.ensure()
        ui.say(f"    {m.path} sha256 {m.sha256[:16]}")
    r = source.open_repo(tree.path)
    wls = [workload.load(w) for w in (pipeline.REAL_SUITE if model_name in model_mod.REAL else pipeline.SUITE)]
    out_dir = (report_dir or Path("patchkit-report")).resolve()
    res = pipeline.verify(r, base_ref=source.BASELINE_TAG, workloads=wls, repeat=repeat, out_dir=out_dir, ui=ui,
                          model_name=model_name)
    paths = report.write(res, out_dir)
    if as_json:
        _emit_json(report.to_json(res))
    else:
        click.echo(report.text_table(res))
        click.echo("timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in res.timings))
        click.echo(f"reports: {paths['md']} {paths['html']} {paths['json']}")
        click.echo("PASS" if res.ok else "FAIL")
    sys.exit(0 if res.ok else 1)


@cli.command("pin")
@click.option("--pr-set", "pr_set", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The fork's pr-set.json (edited in place, everything else kept byte for byte).")
@click.option("--url", required=True, help="https://github.com/OWNER/llama.cpp/pull/N/commits/<40 hex>")
@click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="report.json of a passing `patchkit verify --commit <that sha>`.")
@click.option("--optional", is_flag=True, help='Write {"url": ..., "required": false}.')
@click.option("--dry-run", is_flag=True, help="Show what would change; write nothing.")
@click.option("--owner", "owners", multiple=True, help="Allow another GitHub owner (default: ggml-org, unslothai).")
@click.option("--json", "as_json", is_flag=True)
def pin_cmd(pr_set, url, report_path, optional, dry_run, owners, as_json) -> None:
    """Pin a verified PR commit into pr-set.json: append a new PR, or move an existing PR's pin.

    Refused (file untouched) when the URL is malformed, the file is not valid JSON, or the
    report is missing, failing, or for another commit.

    \b
    Example:
      patchkit verify --repo ~/llama.cpp --commit 59a3d0cb... --report-dir out/
      patchkit pin --pr-set pr-set.json --report out/report.json \\
          --url https://github.com/ggml-org/llama.cpp/pull/15926/commits/59a3d0cb...
    """
    from . import pin as pin_mod

    allowed = pin_mod.OWNERS + tuple(owners)
    res = pin_mod.pin(pr_set, url, report_path, optional=optional, dry_run=dry_run, owners=allowed)
    if as_json:
        _emit_json({"action": res.action, "url": res.url, "replaced": res.old, "written": res.changed and not dry_run})
    else:
        verb = {"added": "added", "replaced": f"replaced {res.old} with", "unchanged": "already pinned:"}[res.action]
        click.echo(f"{'(dry run) would have ' if dry_run and res.changed else ''}{verb} {res.url}")


@cli.command("ci")
@click.option("--repo", type=click.Path(file_okay=False), help="llama.cpp checkout with every pinned commit "
              "(old and new pr-set) fetched. Not needed with --plan.")
@click.option("--base", "base_ref", default="HEAD", show_default=True, help="The upstream base the nightly builds on.")
@click.option("--pr-set", "pr_set", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="pr-set.json after the change (the pull request's).")
@click.option("--old-pr-set", "old_pr_set", type=click.Path(dir_okay=False, path_type=Path),
              help="pr-set.json before the change (absent or missing file: no pins).")
@click.option("--url", "urls", multiple=True, help="Instead of --pr-set: these pins applied to --old-pr-set as "
              "`patchkit pin` would (a PR already listed gets its entry moved in place, a new one is appended); "
              "workflow_dispatch.")
@click.option("--pr-state", "pr_state", type=click.Path(dir_okay=False, path_type=Path),
              help='PR states as GitHub reports them: {"OWNER/llama.cpp#N": {"state": "open|closed|merged", '
              '"head": SHA, "commits": [SHA...]}}. Without it every PR counts as open.')
@click.option("--owner", "owners", multiple=True, help="Allow another GitHub owner.")
@click.option("--expect", type=click.Choice(["auto", *EXPECTATIONS]), default="auto",
              show_default=True, help="auto: the eviction expectations when the after nightly measurably evicts, the "
              "preemption ones when it measurably parks; no-regression always.")
@click.option("--workload", "workloads", multiple=True, help="Repeatable, or comma-separated. Default: the suite.")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 50))
@click.option("--sanitize", default=None, help="Build both nightlies with address,undefined.")
@click.option("--shard", default="", help="This job's name in the matrix (recorded in gate.json).")
@click.option("--upstream-tests", "upstream_tests", default="", help="Also run llama.cpp's own server tests on both "
              "nightlies (comma-separated subsets, files or test ids, e.g. `ci`); with --plan: one more shard for "
              "them. `--workload none` runs no workload (that shard).")
@click.option("--plan", "plan_only", is_flag=True, help="Print the job matrix (JSON) and exit: one shard per "
              "workload x repeat (+ one sanitizer shard with --sanitize).")
@click.option("--report-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("patchkit-gate"),
              show_default=True)
@click.option("--summary", type=click.Path(dir_okay=False, path_type=Path), envvar="GITHUB_STEP_SUMMARY",
              help="Append the Markdown summary here (default: $GITHUB_STEP_SUMMARY).")
@click.option("--json", "as_json", is_flag=True, help="Print gate.json to stdout.")
def ci_cmd(repo, base_ref, pr_set, old_pr_set, urls, pr_state, owners, expect, workloads, repeat, sanitize, shard,
           upstream_tests, plan_only, report_dir, summary, as_json) -> None:
    """The pin gate: judge a pr-set.json change by the nightlies before and after it.

    Before = base + every pin of the old pr-set.json, after = base + every pin of the new one,
    each merged in listed order as the fork's nightly merges them (--no-ff, diff3, pure add/add
    conflicts kept from both sides, anything else stops with the nightly's message). Both are
    built and run on the suite: no request may do worse after than before, and the eviction
    expectations apply when the after nightly evicts. A failure names the responsible pin.

    Exit 0: pass. 1: a verdict failed, or the after nightly does not merge or build (gate.json
    says which, and names the pin). 5/6: the before nightly itself does not merge/build.

    \b
    Examples:
      patchkit ci --repo llama.cpp --base b6500 --old-pr-set old.json --pr-set pr-set.json
      patchkit ci --plan --old-pr-set old.json --pr-set pr-set.json --repeat 2
      patchkit ci --repo llama.cpp ... --workload victim-first --shard "victim-first #1" --report-dir shard-1
      patchkit report merge shard-*/ --out gate
    """
    from . import gate, mix

    allowed = mix.OWNERS + tuple(owners)
    old_text = old_pr_set.read_text() if old_pr_set and old_pr_set.exists() else None
    if urls:
        new_text = None
    elif pr_set:
        new_text = pr_set.read_text()
    else:
        raise UsageError("give --pr-set (the changed pr-set.json) or --url (pins to add to --old-pr-set).")
    # every URL of both files is validated before anything is fetched, merged or built
    old = mix.parse(old_text, allowed, where=str(old_pr_set or "old pr-set"))
    new = mix.with_pins(old, [mix.parse_url(u, allowed) for u in urls]) if urls else mix.parse(
        new_text, allowed, where=str(pr_set))
    wl_names = [w for arg in workloads for w in arg.split(",") if w] or None
    if wl_names == [gate.NO_WORKLOADS]:
        wl_names = []
    for w in wl_names or []:
        workload.load(w)
    up_tests = tuple(t for t in upstream_tests.split(",") if t)
    if plan_only:
        _emit_json(gate.plan(base=base_ref, old_text=old_text, new_text=new_text or json.dumps(urls),
                             workloads=wl_names, repeat=repeat, sanitize=sanitize, entries=old + new,
                             upstream_tests=up_tests))
        return
    if not repo:
        raise UsageError("--repo is required (a llama.cpp checkout with the pinned commits fetched).")
    ui = UI(quiet=as_json)
    r = source.open_repo(repo)
    base = source.resolve(r, base_ref)
    g = gate.gate(r, base=base, old=old, new=new, out_dir=report_dir.resolve(), ui=ui,
                  states=mix.load_states(pr_state), workloads=wl_names, repeat=repeat, expect=expect,
                  opts=_build_options(sanitize, None), upstream_tests=up_tests)
    _gate_out(gate.to_json(g, shard), report_dir.resolve(), summary, as_json)


def _gate_out(data: dict, out_dir: Path, summary: Path | None, as_json: bool) -> None:
    """gate.json + summary.md in out_dir, the summary appended to $GITHUB_STEP_SUMMARY; exit 0/1."""
    from . import gate

    path = gate.write(data, out_dir)
    md = gate.summary_md(data)
    if summary:
        with open(summary, "a") as fh:
            fh.write(md + "\n")
    if as_json:
        _emit_json(data)
    else:
        click.echo(md)
        click.echo(f"gate.json: {path}")
        click.echo("PASS" if data["ok"] else "FAIL")
    sys.exit(0 if data["ok"] else 1)


@cli.group("report")
def report_group() -> None:
    """Work with reports already written."""


@report_group.command("merge")
@click.argument("dirs", nargs=-1, required=True, type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("patchkit-gate"),
              show_default=True, help="Where the merged gate.json and summary.md go.")
@click.option("--summary", type=click.Path(dir_okay=False, path_type=Path), envvar="GITHUB_STEP_SUMMARY",
              help="Append the Markdown summary here (default: $GITHUB_STEP_SUMMARY).")
@click.option("--json", "as_json", is_flag=True)
def report_merge(dirs, out, summary, as_json) -> None:
    """Merge the gate.json of every shard (`patchkit ci --shard`) into one verdict.

    Exit 0 when every shard passed, 1 when one failed.

    Example: patchkit report merge artifacts/*/ --out gate
    """
    from . import gate

    datas = []
    for d in dirs:
        f = d / "gate.json"
        try:
            datas.append(json.loads(f.read_text()))
        except (OSError, json.JSONDecodeError) as e:
            raise ReportError(f"{f}: not a readable gate.json ({e}); was `patchkit ci --report-dir {d}` run?")
    _gate_out(gate.merge(datas), out, summary, as_json)


@cli.command("repro")
@click.option("--repo", type=click.Path(file_okay=False), help="llama.cpp checkout (default: the fetched tree).")
@click.option("--base", "base_ref", default=None, help="Base ref (default HEAD; the baseline on the fetched tree).")
@click.option("--candidate", "cand_ref", default=None, help="Candidate ref: its diff is embedded in the script.")
@click.option("--patch", "patch_name", default=None, help="Candidate: a patch from patches/ (the default).")
@click.option("--patch-file", type=click.Path(dir_okay=False, path_type=Path), help="Candidate: embedded patch file.")
@click.option("--commit", "commit_sha", default=None, help="Candidate commit: its diff is embedded.")
@click.option("--workload", "workloads", multiple=True, help="Default: overflow-4 and victim-first.")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 50))
@click.option("--patchkit-spec", default=None,
              help="What the script pip-installs (a path, a git URL); default: this patchkit's source tree.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
def repro_cmd(repo, base_ref, cand_ref, patch_name, patch_file, commit_sha, workloads, repeat, patchkit_spec, out):
    """Write a self-contained bash script that reproduces the before/after table on a fresh machine.

    Example: patchkit repro --repo ~/llama.cpp --candidate my-fix --out repro.sh && bash repro.sh
    """
    from . import repro

    ui = UI()
    if len([x for x in (cand_ref, patch_name, patch_file, commit_sha) if x]) > 1:
        raise UsageError("give at most one of --candidate, --patch, --patch-file, --commit.")
    r = _repo(repo, ui)
    if base_ref is None and not repo:
        base_ref = source.BASELINE_TAG
    text = repro.render(r, base_ref=base_ref, candidate_ref=cand_ref, patch_name=patch_name, patch_file=patch_file,
                        commit=commit_sha, workloads=list(workloads) or ["overflow-4", "victim-first"],
                        repeat=repeat, patchkit_spec=patchkit_spec or repro.default_spec())
    out.write_text(text)
    out.chmod(0o755)
    click.echo(str(out))


@cli.command("upstream-tests")
@click.option("--repo", type=click.Path(file_okay=False), help="llama.cpp checkout (default: the fetched tree).")
@click.option("--base", "base_ref", default=None, help="Base ref (default: the commit a patchkit series was applied on "
              "when the candidate carries one, else HEAD; the baseline tag on the fetched tree).")
@click.option("--candidate", "cand_ref", default=None, help="Candidate ref (default: the eviction patch applied to the "
              "base, in a private work tree).")
@click.option("--tests", "tests", multiple=True, help="Test files or node ids under tools/server/tests "
              "(test_tokenize, unit/test_basic.py::test_server_props) or a named subset; repeatable. Default: the "
              "whole suite." + help_list(["ci"], "Subsets:"))
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 20),
              help="Runs per side. A test that passes in every base run and fails in any candidate run is an "
              "intermittent regression (blamed, the runs named); one that flips between base runs is flaky.")
@click.option("--text-model", "text_model", default="tiny", show_default=True,
              type=click.Choice(["tiny", *model_mod.REAL]), help="What serves the text presets (tinyllama2, "
              "stories15m_moe): the tiny GGUF (with its draft twin for speculative), or a real model from PyPI.")
@click.option("--timeout", default=120, show_default=True, type=click.IntRange(5, 3600),
              help="Seconds per test phase (setup, call, teardown) before the test fails.")
@click.option("--report-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where upstream.json, the junit files and pytest logs go (default: ./patchkit-upstream).")
@click.option("--json", "as_json", is_flag=True, help="Print upstream.json to stdout, no progress.")
def upstream_tests_cmd(repo, base_ref, cand_ref, tests, repeat, text_model, timeout, report_dir, as_json) -> None:
    """Run llama.cpp's own server tests (tools/server/tests, the candidate's, unedited) against the
    base and the candidate binaries, offline, and compare the pass sets.

    Presets are served by local models (tiny GGUF, its draft twin, SmolLM2); tests whose preset has
    no local stand-in (embedding, rerank, vision, infill), that ask for a Hugging Face model
    themselves, or are marked slow are listed as not run, with the reason. The suite's requirements
    go in a venv cached by the requirements file's hash.

    Exit 0 when no test that passes on the base fails on the candidate, 1 when one does (named,
    with its failure message).

    \b
    Examples:
      patchkit upstream-tests --tests ci                       # default tree, base vs eviction patch
      patchkit upstream-tests --repo ~/llama.cpp --base main --candidate my-fix --repeat 2
      patchkit upstream-tests --repo R --tests test_tokenize --tests unit/test_basic.py::test_server_props
    """
    from . import upstream
    from . import verify as pipeline

    ui = UI(quiet=as_json)
    r = _repo(repo, ui)
    if base_ref is None and not repo:
        base_ref = source.BASELINE_TAG
    base, why = pipeline.choose_base(r, base_ref, cand_ref)
    ui.say(f"base {base[:12]}: {why}")
    with ui.step("prepare candidate"):
        cand, label, _layout, _src = pipeline.resolve_candidate(r, base, candidate_ref=cand_ref, progress=ui.say)
    pipeline.refuse_vacuous(r, base, why, cand, label)
    ui.say(f"candidate {cand[:12]}: {label}")
    out_dir = (report_dir or Path("patchkit-upstream")).resolve()
    with ui.step("server tests, base and candidate"):
        res = upstream.run(r, base, cand, candidate_label=label, tests=tests, repeat=repeat, out_dir=out_dir,
                           text_model=text_model, timeout=timeout, say=ui.say, progress=ui.progress)
    path = upstream.write(res, out_dir)
    if as_json:
        _emit_json(upstream.to_json(res))
    else:
        click.echo(upstream.text_summary(res))
        click.echo(f"report: {path}")
        click.echo("PASS" if res.ok else "FAIL")
    sys.exit(0 if res.ok else 1)
