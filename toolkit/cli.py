"""The `patchkit` command: a thin click layer over the library.

Every command prints progress on stderr and its result on stdout (the last line is the
path or verdict a script wants); --json prints one JSON document instead. Errors are
PatchkitError subclasses, each with its own exit code (docs/exit-codes.md).
"""
from __future__ import annotations

import logging
import signal
import sys
import time
from pathlib import Path

import click

from . import build as build_mod
from . import model as model_mod
from . import proc, source, workload
from .cli_options import (SANITIZE_ONLY_HELP, build_options, candidate_options, default_base, emit_json,
                          expect_option, json_option, model_option, open_repo, policy_option, repo_option,
                          workloads_option)
from .errors import EXIT_CODES, INCONCLUSIVE, Interrupted, PatchkitError, UsageError
from .ui import UI


OUTCOME_EXIT = {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": INCONCLUSIVE}


def outcome_line(outcome: str) -> str:
    if outcome == "INCONCLUSIVE":
        return ("INCONCLUSIVE: nothing failed, but the runs did not show everything they were designed to (see "
                "'inconclusive' and 'not reached' above): run with --repeat 3, on a quieter machine, or check "
                "that upstream's log still prints what the check reads")
    return outcome


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
        emit_json({"package": package, "version": version, "path": str(tree.path), "commit": tree.commit,
                    "fetched": tree.fetched})
    else:
        click.echo(str(tree.path))


@cli.group("cache", invoke_without_command=True)
@click.pass_context
def cache_group(ctx) -> None:
    """What patchkit keeps under PATCHKIT_CACHE (default ~/.cache/patchkit), and pruning it.

    \b
    Examples:
      patchkit cache                  # the size of each kind (same as `patchkit cache show`)
      patchkit cache prune --max-gb 5
    """
    if ctx.invoked_subcommand is None:
        ctx.invoke(cache_show)


@cache_group.command("show")
@click.option("--json", "as_json", is_flag=True)
def cache_show(as_json: bool = False) -> None:
    """The cache's size per kind: sdists, trees, workspaces, binaries, models, ccache, harnesses,
    sensitivity measurements, facts, server help, launchers, upstream tests, and anything else.

    Example: patchkit cache show --json
    """
    from . import cache
    rows = cache.usage()
    if as_json:
        emit_json({"root": str(cache.root()), "max_bytes": cache.max_bytes(),
                   "kinds": {k: {"bytes": b, "entries": n} for k, b, n in rows}})
        return
    click.echo(f"{cache.root()}  (cap {cache.max_bytes() / 1e9:.0f} GB: PATCHKIT_CACHE_MAX_GB)")
    for k, b, n in rows:
        click.echo(f"  {k:<15} {b / 1e6:>9.1f} MB  {n} entr{'y' if n == 1 else 'ies'}")
    click.echo(f"  {'total':<15} {sum(b for _k, b, _n in rows) / 1e6:>9.1f} MB")


@cache_group.command("prune")
@click.option("--max-gb", default=None, type=click.FloatRange(0), help="Prune down to this many GB (default: "
              "PATCHKIT_CACHE_MAX_GB, else 20). Every new build applies the default cap by itself.")
@click.option("--all-ages", is_flag=True, help="Also entries used in the last hour (by default spared: a verify "
              "beside may be about to start one of its binaries).")
@click.option("--json", "as_json", is_flag=True)
def cache_prune(max_gb, all_ages, as_json) -> None:
    """Remove the least recently used workspaces, binaries, harnesses, measurements, facts, server
    help and launchers down to a cap.

    Never removes what another patchkit process holds, nor sdists, trees, models, ccache or
    upstream's test venvs (each removed entry comes back by an incremental, ccache-served build,
    one parse or one run).
    Example: patchkit cache prune --max-gb 5
    """
    from . import cache
    removed = cache.prune(None if max_gb is None else int(max_gb * 1e9), min_age_s=0 if all_ages else 3600)
    if as_json:
        emit_json({"removed": [{"path": str(p), "bytes": b} for p, b in removed]})
        return
    for p, b in removed:
        click.echo(f"removed {p} ({b / 1e6:.1f} MB)")
    click.echo(f"{len(removed)} entr{'y' if len(removed) == 1 else 'ies'} removed, "
               f"{sum(b for _p, b in removed) / 1e6:.1f} MB freed")


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
      patchkit model --arch witness-swa   # the oracle's model on gemma2's graph: its stream sees every cell
      patchkit model --arch witness-hybrid  # ... on lfm2's graph: it also sees the recurrent state
    """
    m = model_mod.ensure(model_mod.DRAFT if draft else model_mod.FAMILIES[arch], out)
    click.echo(f"sha256 {m.sha256}  ({m.path.stat().st_size} bytes, {m.n_vocab} tokens)")
    click.echo(str(m.path))


@cli.command("build")
@repo_option()
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
    opts = build_options(sanitize, build_dir, sanitize_only)
    r = open_repo(repo, ui)
    with ui.step("build llama-server"):
        built = build_mod.build(r, ref, opts, progress=ui.progress)
    ui.say(f"{'reused cached build' if built.reused else f'built in {built.seconds:.1f} s'} "
           f"(commit {built.commit[:12]}, compile_commands: {built.workspace.compile_commands})")
    if as_json:
        emit_json({"binary": str(built.binary), "commit": built.commit, "tree": built.tree,
                    "reused": built.reused, "seconds": round(built.seconds, 2),
                    "compile_commands": str(built.workspace.compile_commands), "log": str(built.workspace.log)})
    else:
        click.echo(str(built.binary))


@cli.command("verify")
@repo_option()
@click.option("--base", "base_ref", default=None, help="Base ref. Default: the commit a patchkit series was applied "
              "on when the candidate (or HEAD) is one; else HEAD (the baseline tag on the fetched tree). A base equal to "
              "the candidate is refused.")
@candidate_options()
@policy_option()
@click.option("--variant", default=None, hidden=True, help="A deliberately broken rendering (oracle self-test).")
@click.option("--baseline-only", is_flag=True, help="Run the workloads on the base only (show the bug).")
@workloads_option()
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 50), help="Runs per workload and side.")
@click.option("--report-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where report.json/md/html and server logs go (default: ./patchkit-report).")
@click.option("--sanitize", default=None, help="Build both sides with address,undefined (the tree's own "
              "LLAMA_SANITIZE_* options); any sanitizer report fails the run.")
@click.option("--sanitize-only", "sanitize_only", multiple=True, metavar="GLOB", help=SANITIZE_ONLY_HELP)
@model_option()
@expect_option()
@json_option("Print report.json to stdout, no progress.")
@click.option("--promises", "promises_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="What the candidate promises beyond the property (a small TOML file, docs/commands.md 'Promises'): "
              "it gets the checks of patchkit's own series that promise the same. Default: its trailer, or "
              "patchkit's code recognised in it, else nothing (the property alone).")
@click.option("--upstream-tests", "upstream_tests", multiple=True, help="Also run llama.cpp's own server tests "
              "(tools/server/tests) on both sides, offline: a subset name (`ci`), a file or a test id; repeatable. "
              "A test that passes on the base and fails on the candidate fails the verdict (see upstream-tests).")
@click.option("--fail-fast", "fail_fast", is_flag=True, help="Stop after the first workload whose candidate fails a "
              "check: FAIL with that evidence, the other workloads listed as not run. A patch that hangs costs about "
              "a minute per workload (its requests wait out their idle timeout, then a probe its own), so the "
              "whole suite would take half an hour to say FAIL.")
def verify_cmd(repo, base_ref, candidate_ref, patch_name, patch_file, commit, policy, variant, baseline_only,
               workloads, repeat, report_dir, sanitize, sanitize_only, model_name, expect, as_json,
               promises_file, upstream_tests, fail_fast) -> None:
    """Build base and candidate, run overflow workloads on both, judge every slot's outcome.

    Exit 0 when every expectation holds, 1 when one fails (report says which).

    \b
    Examples:
      patchkit verify                                         # default tree, default patch, suite
      patchkit verify --repo ~/llama.cpp --baseline-only --workload overflow-4
      patchkit verify --repo ~/llama.cpp --candidate patchkit/evict-largest-slot --repeat 3
                                                              # base: the commit the series was applied on
      patchkit verify --repo ~/llama.cpp --commit 59a3d0cb8f61 --report-dir out/
      patchkit verify --repo ~/llama.cpp --patch-file fix.patch --fail-fast   # stop at the first failure
    """
    from . import report
    from . import verify as pipeline

    ui = UI(quiet=as_json)
    if baseline_only and any((candidate_ref, patch_name, patch_file, commit, promises_file)):
        raise UsageError("--baseline-only runs no candidate; drop the candidate option.")
    if baseline_only and fail_fast:
        raise UsageError("--baseline-only runs no candidate, so no candidate can fail; drop --fail-fast.")
    if promises_file:
        from .promises import load
        load(promises_file)   # a bad declaration is refused before anything is built
    r = open_repo(repo, ui)
    base_ref = default_base(base_ref, repo)
    default = pipeline.REAL_SUITE if model_name in model_mod.REAL else pipeline.SUITE
    wls = [workload.load(w) for w in (workloads or (["overflow-4"] if baseline_only else default))]
    out_dir = (report_dir or Path("patchkit-report")).resolve()
    res = pipeline.verify(r, base_ref=base_ref, candidate_ref=candidate_ref, patch_name=patch_name,
                          patch_file=patch_file, commit=commit, baseline_only=baseline_only, policy=policy,
                          variant=variant, workloads=wls, repeat=repeat, out_dir=out_dir, ui=ui,
                          opts=build_options(sanitize, None, sanitize_only), model_name=model_name,
                          expect=expect, promises_file=promises_file, fail_fast=fail_fast)
    paths = report.write(res, out_dir)
    up = None
    if upstream_tests and res.candidate_commit:
        from . import upstream
        with ui.step("upstream server tests, base vs candidate"):
            up = upstream.run(r, res.base_commit, res.candidate_commit, candidate_label=res.candidate_label,
                              tests=upstream_tests, repeat=1, out_dir=out_dir / "upstream", say=ui.say,
                              progress=ui.progress, opts=build_options(sanitize, None, sanitize_only))
        upstream.write(up, out_dir / "upstream")
    ok = res.ok and (up is None or up.ok)
    outcome = res.outcome if ok else "FAIL"
    if as_json:
        emit_json({**report.to_json(res), "ok": ok, "outcome": outcome,
                    "upstream": upstream.to_json(up) if up else None})
    else:
        click.echo(report.text_table(res))
        if up:
            click.echo(upstream.text_summary(up))
        click.echo(f"reports: {paths['md']} {paths['html']} {paths['json']}"
                   + (f" {out_dir / 'upstream' / 'upstream.json'}" if up else ""))
        click.echo(outcome_line(outcome))
    sys.exit(OUTCOME_EXIT[outcome])


@cli.command("apply")
@click.option("--repo", type=click.Path(file_okay=False), required=True, help="Your llama.cpp checkout.")
@click.option("--patch", "patch_name", default="evict-largest-slot", show_default=True,
              help="Patch folder under patches/.")
@policy_option("Whom the patch chooses: most cells, fewest cells, newest task (not-leader-smallest: the "
               "preemption families); each family lists its own in its patch.toml.")
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
        emit_json({"status": "reverted", "to": where, "branch_deleted": deleted}) if as_json else click.echo(msg)
        return
    res = apply_mod.apply(r, patch_name=patch_name, policy=policy, branch=branch, check=dry, progress=ui.say)
    if as_json:
        emit_json({"status": res.status, "layout": res.layout, "branch": res.branch, "base": res.base_commit,
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
        emit_json({"ok": ok, "commit": res.commit, "file": res.file, "errors": list(res.errors),
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
@model_option("e.g. smollm2: a real model and its text workloads.")
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
    with ui.step(f"{model_name or model_mod.DEFAULT} model"):
        m = model_mod.resolve(model_name or model_mod.DEFAULT, ui.say)
        ui.say(f"    {m.path} sha256 {m.sha256[:16]}")
    r = source.open_repo(tree.path)
    wls = [workload.load(w) for w in (pipeline.REAL_SUITE if model_name in model_mod.REAL else pipeline.SUITE)]
    out_dir = (report_dir or Path("patchkit-report")).resolve()
    res = pipeline.verify(r, base_ref=source.BASELINE_TAG, workloads=wls, repeat=repeat, out_dir=out_dir, ui=ui,
                          model_name=model_name)
    paths = report.write(res, out_dir)
    if as_json:
        emit_json(report.to_json(res))
    else:
        click.echo(report.text_table(res))
        click.echo("timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in res.timings))
        click.echo(f"reports: {paths['md']} {paths['html']} {paths['json']}")
        click.echo(outcome_line(res.outcome))
    sys.exit(OUTCOME_EXIT[res.outcome])


# the reviewers' and maintainers' proofs, and the fork's pin gate: their commands register on `cli`
from . import cli_gate, cli_proof  # noqa: E402,F401
