"""The commands that prove a change beyond one verify: the mutation campaign, the referee of every
strategy (and a fork's branches), the series exported for upstream, the reviewer's repro script,
and llama.cpp's own server tests as a second opinion. Thin: parse, call the library, print.
"""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import click

from . import model as model_mod
from . import promises, source, workload
from . import traffic as traffic_mod
from .cli import cli
from .cli_options import (candidate_options, default_base, emit_json, model_option, open_repo,
                          repo_option)
from .errors import UsageError
from .sensitivity import KINDS as SENS_KINDS
from .ui import UI, help_list


@cli.command("mutants")
@repo_option()
@click.option("--base", "base_ref", default=None, help="The unpatched base (default: HEAD; the baseline tag on the "
              "fetched tree).")
@click.option("--patch", "patch_name", default="evict-largest-slot", show_default=True,
              help="Whose catalog: the eviction patch's mutants, or a preemption patch's broken variants "
              "(park-slot, recompute-slot, hybrid-slot), each judged by that patch's own expectations.")
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
@click.option("--merge", "merge_dirs", multiple=True, type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Join the shards of one --operators campaign: each a report dir holding its operators.json "
              "(repeatable). Writes the merged operators.json to --report-dir; builds and runs nothing.")
@model_option("Serve this model for every workload (default: each workload's own, the witness); "
              "`--model tiny` measures what the campaign killed before the witness.")
@click.option("--json", "as_json", is_flag=True)
def mutants_cmd(repo, base_ref, patch_name, names, workloads, repeat, report_dir, list_only, operators, sample_n,
                seed, shard, merge_dirs, model_name, as_json) -> None:
    """Run the mutation campaign: how many wrong patches does the verdict kill?

    Each mutant is the rendered eviction patch with one edit (a wrong victim
    quantity, the batch surgery skipped or off by one, two victims, the victim's cells kept,
    a guard inverted...; patches/evict-largest-slot/patch.toml). Each is built on the base
    (one TU on the shared build) and judged as a candidate: static checks, the C++ property
    harness, the workload suite. Prints mutant -> killed (by which check, where, why),
    not-reached (its killer skipped in every run) or ALIVE, and the mutation score. Exit 0
    when every mutant not claimed equivalent is killed, 1 otherwise.

    \b
    Examples:
      patchkit mutants --list
      patchkit mutants                                   # default tree, whole catalog
      patchkit mutants --repo T --mutant victim-by-prompt --mutant entries-kept --json
      patchkit mutants --patch park-slot --repeat 3       # the preemption patch's broken variants
      patchkit mutants --model tiny --report-dir before   # what a model blind to the cells kills
      patchkit mutants --operators --shard 2/4 --report-dir s2   # one job of a CI matrix ...
      patchkit mutants --merge s1 --merge s2 --merge s3 --merge s4 --report-dir all   # ... and the join
    """
    from dataclasses import asdict

    from . import mutate
    from . import verify as pipeline

    from . import patch as patch_mod

    patch_mod.load_patch(patch_name)  # an unknown name is refused with the known ones
    cat = mutate.catalog(patch_name)
    if merge_dirs:
        docs = []
        for d in merge_dirs:
            try:
                docs.append(json.loads((d / "operators.json").read_text()))
            except (OSError, json.JSONDecodeError) as e:
                raise UsageError(f"{d / 'operators.json'}: not a readable operators.json ({e}); was "
                                 f"`patchkit mutants --operators --report-dir {d}` run?")
        camp = mutate.merge_operator_docs(docs)
        out_dir = (report_dir or Path("patchkit-mutants")).resolve()
        out_dir.mkdir(parents=True, exist_ok=True)
        doc = mutate.operator_doc(camp)
        (out_dir / "operators.json").write_text(json.dumps(doc, indent=2))
        emit_json(doc) if as_json else click.echo(mutate.operator_table(camp))
        sys.exit(0 if not camp.alive else 1)
    if list_only:
        for n, m in cat.items():
            click.echo(f"{n:22} {m.get('class', ''):18} killer {m.get('killer', '-'):24} {m.get('what', '')}")
        return
    ui = UI(quiet=as_json)
    r = open_repo(repo, ui)
    base_ref = default_base(base_ref, repo)
    base = source.resolve(r, base_ref)
    fallback = mutate.PREEMPTION_WORKLOADS if patch_mod.load_patch(patch_name).expect == "preemption" \
        else pipeline.SUITE
    default = fallback if operators else mutate.default_workloads(patch_name, list(names or cat), fallback)
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
                                        patch_name=patch_name, model_name=model_name)
        doc = mutate.operator_doc(camp)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "operators.json").write_text(json.dumps(doc, indent=2))
        emit_json(doc) if as_json else click.echo(mutate.operator_table(camp))
        sys.exit(0 if not camp.alive else 1)
    res = mutate.campaign(r, base, list(names or cat), wls, repeat=repeat, out_dir=out_dir / "logs", say=ui.say,
                          progress=ui.progress, patch_name=patch_name, model_name=model_name)
    killed, judged = mutate.score(res)
    doc = {"base": base, "model": model_name or "", "score": {"killed": killed, "judged": judged},
           "mutants": [asdict(x) for x in res]}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "mutants.json").write_text(json.dumps(doc, indent=2))
    if as_json:
        emit_json(doc)
    else:
        click.echo(mutate.table(res))
    sys.exit(0 if killed == judged else 1)


@cli.command("referee")
@repo_option()
@click.option("--base", "base_ref", default=None, help="The unpatched base (default: HEAD; the baseline tag on the "
              "fetched tree).")
@click.option("--strategy", "strategies", multiple=True, help="STRATEGY[:POLICY], repeatable: base, terminate, park "
              "(swap to host memory), recompute, hybrid (swap within LLAMA_ARG_PREEMPT_RAM, else recompute), "
              "recompute-prefill; policies largest, smallest, newest, not-leader-smallest. Default: base, "
              "terminate:largest, park:largest|smallest|not-leader-smallest, recompute:largest|smallest, hybrid:largest.")
@click.option("--workload", "workloads", multiple=True, help="Workload name or .toml path; repeatable (default: "
              "overflow-4, staggered, overflow-8, staggered-8: 4 and 8 chats, together and staggered; many-resumes-8: "
              "seconds of parks and resumes).")
@model_option("Serve this model for every workload (e.g. smollm2).")
@click.option("--candidate", "cand_refs", multiple=True, metavar="REF", help="Also a row for this ref of --repo "
              "(a fork's PR branch), repeatable: judged by what it measurably does (it parks -> the preemption "
              "expectations, it evicts -> the eviction ones, else no regression).")
@click.option("--candidate-env", "cand_envs", multiple=True, metavar="REF=NAME=VALUE", help="An environment "
              "variable for that candidate's servers (a knob the PR reads), repeatable.")
@click.option("--candidate-args", "cand_args", multiple=True, metavar="REF=ARGS", help="Server flags for that "
              "candidate's servers, shell-quoted (e.g. fork/pr-186='--preempt-ram 0'), repeatable.")
@click.option("--candidate-promises", "cand_promises", multiple=True, metavar="REF=FILE", help="What that candidate "
              "promises beyond the property (a promises file, docs/commands.md 'Promises'): judged as patchkit's "
              "own series that promise the same. Without it: its trailer, or patchkit's code recognised in it.")
@click.option("--traffic", "traffic_names", multiple=True, metavar="NAME", help="Also serve this traffic workload "
              "(a name or .toml path, as `patchkit traffic --workload` takes: chat sessions through the official `openai` "
              "client on upstream's defaults) "
              "on every row, repeatable: per strategy, goodput, p99 latency, runs with every turn exact and failed "
              "attempts, each turn against its solo control. Served by the traffic's own model.")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 50), help="Runs per strategy and "
              "workload: the table gives each figure's median and range, and names a faster strategy only where "
              "every run of it beat every run of the other (a rank test; 3 runs each at least).")
@click.option("--markdown", "markdown_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the table as a pull-request comment here, with the command that reproduces it.")
@click.option("--report-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("patchkit-referee"),
              show_default=True, help="Where report.json/md/html (table and chart) and the server logs go.")
@click.option("--json", "as_json", is_flag=True)
def referee_cmd(repo, base_ref, strategies, workloads, model_name, cand_refs, cand_envs, cand_args, cand_promises,
                traffic_names, repeat, markdown_path, report_dir, as_json) -> None:
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
      patchkit referee --strategy base --strategy terminate:largest --strategy park:largest \\
          --workload overflow-4 --traffic lmstudio-1757 --repeat 5   # the users' traffic, ranked
    """
    from . import referee as ref_mod
    from . import traffic as traffic_mod

    ui = UI(quiet=as_json)
    r = open_repo(repo, ui)
    base_ref = default_base(base_ref, repo)
    base = source.resolve(r, base_ref)
    entries = ref_mod.parse(tuple(strategies) or ref_mod.DEFAULT)
    envs: dict[str, dict[str, str]] = {ref: {} for ref in cand_refs}
    for item in cand_envs:
        ref, _, kv = item.partition("=")
        name, eq, value = kv.partition("=")
        if ref not in envs or not name or not eq:
            raise UsageError(f"--candidate-env takes REF=NAME=VALUE for a ref given with --candidate, not '{item}'.")
        envs[ref][name] = value
    flags: dict[str, tuple[str, ...]] = {ref: () for ref in cand_refs}
    for item in cand_args:
        ref, eq, text = item.partition("=")
        if ref not in flags or not eq:
            raise UsageError(f"--candidate-args takes REF=ARGS for a ref given with --candidate, not '{item}'.")
        flags[ref] += tuple(shlex.split(text))
    declared: dict[str, Path] = {}
    for item in cand_promises:
        ref, eq, path = item.partition("=")
        if ref not in envs or not eq or not path:
            raise UsageError(f"--candidate-promises takes REF=FILE for a ref given with --candidate, not '{item}'.")
        declared[ref] = Path(path)
        promises.load(declared[ref])   # a bad file is refused before anything is built
    wls = [workload.load(w) for w in (workloads or ref_mod.DEFAULT_WORKLOADS)]
    traffics = tuple(traffic_mod.load(n) for n in traffic_names)   # a bad name is refused before any build
    out_dir = report_dir.resolve()
    command = "patchkit referee " + shlex.join(
        [*(("--repo", repo) if repo else ()), "--base", base, *(a for e in entries for a in ("--strategy", e.label)),
         *(a for w in wls for a in ("--workload", w.name)), *(("--model", model_name) if model_name else ()),
         *(a for ref in cand_refs for a in ("--candidate", ref)), *(a for x in cand_envs for a in ("--candidate-env", x)),
         *(a for x in cand_args for a in ("--candidate-args", x)),
         *(a for x in cand_promises for a in ("--candidate-promises", x)),
         *(a for t in traffics for a in ("--traffic", t.name)), "--repeat", str(repeat)])
    table = ref_mod.referee(r, base, entries, wls, model_name=model_name, out_dir=out_dir / "logs", say=ui.say,
                            progress=ui.progress, candidates=tuple((ref, envs[ref], flags[ref]) for ref in cand_refs),
                            declared=declared, traffics=traffics,
                            repeat=repeat, command=command)
    paths = ref_mod.write(table, out_dir, markdown_path.resolve() if markdown_path else None)
    if as_json:
        emit_json(ref_mod.to_json(table))
    else:
        click.echo(ref_mod.markdown(table))
        click.echo("reports: " + " ".join(str(p) for p in paths.values()))
    sys.exit(0 if all(row.verdict != "FAIL" for row in table.rows)
             and all(r.outcome != "FAIL" for tt in table.traffic for r in tt.rows) else 1)


@cli.command("export")
@repo_option()
@click.option("--base", "base_ref", default=None, help="The commit the series goes on (default: the commit under "
              "the candidate's patchkit series).")
@click.option("--candidate", "candidate_ref", default=None, help="The series' tip (default: HEAD when it carries a "
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
def export_cmd(repo, base_ref, candidate_ref, out_dir, patch_name, mutants_json, sanitize, repeat, as_json) -> None:
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
    r = open_repo(repo, ui)
    head = source.resolve(r, None)
    cand = source.resolve(r, candidate_ref) if candidate_ref else None
    if cand is None and series_base(r, head):
        cand = head
    base = source.resolve(r, base_ref) if base_ref else (series_base(r, cand, within=pipeline.SERIES_DEPTH)
                                                         if cand else head)
    if base is None:
        raise UsageError(f"{candidate_ref} carries no patchkit series: name the commit it goes on with --base.")
    if cand is None:
        from . import apply as apply_mod
        cand, _ = apply_mod.candidate_commit(r, base, patch_name or apply_mod.patch.DEFAULT_PATCH, progress=ui.say)
    pipeline.refuse_vacuous(r, base, "--base" if base_ref else "the series' base", cand, candidate_ref or "the series")
    res = export_mod.export(r, base, cand, out_dir.resolve(), repo_arg=repo or str(r.working_tree_dir),
                            mutants_json=mutants_json, sanitize=sanitize, repeat=repeat, say=ui.say,
                            progress=ui.progress, patch_name=patch_name)
    if as_json:
        own = res.own_test
        emit_json({"ok": res.ok, "patches": [str(p) for p in res.patches], "description": str(res.description),
                   "tip": res.tip, "own_test": None if own is None else {
                       "path": own.path, "ok": own.ok, "base": own.base, "base_message": own.base_message,
                       "candidate": own.candidate, "candidate_message": own.candidate_message}})
    else:
        for p in res.patches:
            click.echo(str(p))
        click.echo(str(res.description))
        click.echo("PASS" if res.ok else "FAIL")
    sys.exit(0 if res.ok else 1)


@cli.command("repro")
@repo_option()
@click.option("--base", "base_ref", default=None, help="Base ref (default HEAD; the baseline on the fetched tree).")
@candidate_options(candidate_help="Candidate ref: its diff is embedded in the script.",
                   patch_help="Candidate: a patch from patches/ (the default).")
@click.option("--workload", "workloads", multiple=True, help="Default: overflow-4 and victim-first.")
@click.option("--traffic", "traffic_names", multiple=True, help="Also run a traffic workload (a name from "
              "fixtures/traffic/, e.g. lmstudio-1757) after the lab workloads: the users' chat turns before and "
              "after; repeatable. The script exits with verify's code if that fails, else with the traffic's.")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 50))
@click.option("--patchkit-spec", default=None,
              help="What the script pip-installs (a path, a git URL); default: this patchkit's source tree.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
def repro_cmd(repo, base_ref, candidate_ref, patch_name, patch_file, commit, workloads, traffic_names, repeat,
              patchkit_spec, out):
    """Write a self-contained bash script that reproduces the before/after table on a fresh machine.

    Example: patchkit repro --repo ~/llama.cpp --candidate my-fix --out repro.sh && bash repro.sh

    With --traffic lmstudio-1757 the script also serves the users' chat traffic to base and
    candidate and prints who lost which turns before and after.
    """
    from . import repro
    from . import traffic as traffic_mod

    ui = UI()
    for name in traffic_names:
        traffic_mod.load(name)          # a name that does not exist is refused here, not on the reviewer's machine
    r = open_repo(repo, ui)
    text = repro.render(r, base_ref=default_base(base_ref, repo), candidate_ref=candidate_ref, patch_name=patch_name,
                        patch_file=patch_file, commit=commit, workloads=list(workloads) or ["overflow-4", "victim-first"],
                        repeat=repeat, patchkit_spec=patchkit_spec or repro.default_spec(),
                        traffic=list(traffic_names))
    out.write_text(text)
    out.chmod(0o755)
    click.echo(str(out))


@cli.command("upstream-tests")
@repo_option()
@click.option("--base", "base_ref", default=None, help="Base ref (default: the commit a patchkit series was applied on "
              "when the candidate carries one, else HEAD; the baseline tag on the fetched tree).")
@click.option("--candidate", "candidate_ref", default=None, help="Candidate ref (default: the eviction patch applied to the "
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
def upstream_tests_cmd(repo, base_ref, candidate_ref, tests, repeat, text_model, timeout, report_dir, as_json) -> None:
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
    r = open_repo(repo, ui)
    base_ref = default_base(base_ref, repo)
    base, why = pipeline.choose_base(r, base_ref, candidate_ref)
    ui.say(f"base {base[:12]}: {why}")
    with ui.step("prepare candidate"):
        cand, label, _layout, _src = pipeline.resolve_candidate(r, base, candidate_ref=candidate_ref, progress=ui.say)
    pipeline.refuse_vacuous(r, base, why, cand, label)
    ui.say(f"candidate {cand[:12]}: {label}")
    out_dir = (report_dir or Path("patchkit-upstream")).resolve()
    with ui.step("server tests, base and candidate"):
        res = upstream.run(r, base, cand, candidate_label=label, tests=tests, repeat=repeat, out_dir=out_dir,
                           text_model=text_model, timeout=timeout, say=ui.say, progress=ui.progress)
    path = upstream.write(res, out_dir)
    if as_json:
        emit_json(upstream.to_json(res))
    else:
        click.echo(upstream.text_summary(res))
        click.echo(f"report: {path}")
        click.echo("PASS" if res.ok else "FAIL")
    sys.exit(0 if res.ok else 1)


@cli.command("sensitivity")
@repo_option()
@click.option("--ref", default=None, help="The tree whose libllama runs the harness (default: HEAD; the baseline on "
              "the fetched tree). A server patch does not change it: every patched tree of one base shares it.")
@click.option("--model", "models", multiple=True, help="A tiny family (witness, witness-swa, witness-hybrid, tiny, "
              "gemma2, lfm2) or a .gguf path; repeatable, one column each (default: all six).")
@click.option("--trials", default=50, show_default=True, type=click.IntRange(1, 100000),
              help="Histories per model; every kind perturbs each one once.")
@click.option("--gen", "n_gen", default=64, show_default=True, type=click.IntRange(1, 1024),
              help="A perturbation counts as seen when the continuation differs within this many tokens.")
@click.option("--seed", default=1, show_default=True, help="Seed of the histories, positions and sampler seeds.")
@click.option("--kind", "kinds", multiple=True, type=click.Choice(list(SENS_KINDS)),
              help="Only these kinds (repeatable; default: all).")
@click.option("--min-share", default=None, type=click.FloatRange(0, 1), help="Exit 1 when the FIRST model sees "
              "less than this share of any kind (e.g. 0.99 for the witness).")
@click.option("--json", "as_json", is_flag=True)
def sensitivity_cmd(repo, ref, models, trials, n_gen, seed, kinds, min_share, as_json) -> None:
    """Measure the oracle: what a one-cell change of the KV history does to a model's stream.

    A C++ harness against the tree's own libllama (compiled once per library content) decodes
    seeded histories of 300-900 cells, perturbs each with llama.cpp's memory API (drop, duplicate,
    change, shift, overlap, another sequence's cell, a sampler reset) and counts the continuations
    that differ within --gen tokens. The row `batch` continues the same history beside other
    sequences, in another batch shape: a divergence there is noise, and makes the exit 1.

    \b
    Examples:
      patchkit sensitivity                                   # the witnesses vs tiny, gemma2, lfm2, 50 histories
      patchkit sensitivity --model witness --trials 1000 --min-share 0.99
      patchkit sensitivity --repo ~/llama.cpp --model my.gguf --kind change --kind batch --json
    """
    from . import sensitivity as sens

    ui = UI(quiet=as_json)
    r = open_repo(repo, ui)
    ref = default_base(ref, repo) or "HEAD"
    commit = r.git.rev_parse(f"{ref}^{{commit}}")
    with ui.step("perturbation harness"):
        binary = sens.harness(r, commit, progress=ui.progress)
    results = []
    for name in models or ("witness", "witness-swa", "witness-hybrid", "tiny", "gemma2", "lfm2"):
        with ui.step(f"perturb {trials} histories on {name}"):
            results.append(sens.measure(binary, name, trials=trials, n_gen=n_gen, seed=seed,
                                        kinds=tuple(kinds) or sens.KINDS, progress=ui.progress))
    noisy = [m.model for m in results if m.kind("batch").detected] if "batch" in (kinds or sens.KINDS) else []
    weak = []
    if min_share is not None:
        weak = [k.kind for k in results[0].kinds if k.kind != "batch" and k.share is not None and k.share < min_share]
    if as_json:
        emit_json({"commit": commit, "trials": trials, "n_gen": n_gen, "seed": seed,
                   "models": [sens.to_json(m) for m in results],
                   "batch_divergent": noisy, "below_min_share": weak})
    else:
        click.echo(sens.table(results))
        for kind in results[0].kinds:
            click.echo(f"  {kind.kind}: {sens.MEANING[kind.kind]}")
        if noisy:
            click.echo(f"NOT BATCH-INVARIANT: {', '.join(noisy)} (a stream compared with its control can differ "
                       "without any bug)")
        if weak:
            click.echo(f"BELOW {min_share}: {results[0].model} on {', '.join(weak)}")
    sys.exit(1 if noisy or weak else 0)


@cli.command("traffic")
@repo_option()
@click.option("--base", "base_ref", default=None, help="The unpatched base (default: HEAD; the baseline tag on the "
              "fetched tree).")
@candidate_options()
@click.option("--workload", "names", multiple=True, help="A traffic workload: a name or a .toml path; repeatable "
              "(default: all of fixtures/traffic)." + help_list(traffic_mod.available(), "Known:"))
@click.option("--variant", default=None, help="With --patch (or the default patch): one of its catalog's broken "
              "variants (patch.toml [variants.*], e.g. victim-not-freed), to see whether the users' traffic "
              "catches it.")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1, 20), help="Runs per workload and "
              "side: a check must hold in every run; goodput and p99 latency are reported as medians with ranges.")
@click.option("--candidate-only", is_flag=True, help="Skip the base's run (its losses are the 'before' of the "
              "table; the candidate is judged the same, against controls the base binary serves).")
@click.option("--report-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where traffic.json and the server logs go (default: ./patchkit-traffic).")
@click.option("--promises", "promises_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="What the candidate promises (docs/commands.md 'Promises'): expect = \"preemption\" holds it to "
              "'no request ended', else one request per overflow. Default: its trailer or patchkit's code in it.")
@click.option("--json", "as_json", is_flag=True)
def traffic_cmd(repo, base_ref, candidate_ref, patch_name, patch_file, commit, names, variant, repeat,
                candidate_only, report_dir, promises_file, as_json) -> None:
    """Serve the users' traffic on base and candidate: chat sessions through the openai client.

    Seeded users hold multi-turn conversations over /v1/chat/completions (streamed, the
    official `openai` client and its retry policy) on a server with upstream's defaults but the
    pool (-c, -np, -kvu): slots chosen by similarity, the prompt cache, a queue. A turn that
    fails is regenerated by its user. Every completed turn must equal the same turn served
    alone on a quiet base server; each overflow must end one request (a preemption family: none);
    every conversation must complete; a series that promises it must hold back a request queued
    while another is parked until that one is back (parked-first, read per task from upstream's
    log). Exit 0 PASS, 1 FAIL (quoted), 11 INCONCLUSIVE (the pool never ran out).

    \b
    Examples:
      patchkit traffic                                     # default tree, default patch, every workload
      patchkit traffic --workload lmstudio-1757 --json
      patchkit traffic --patch park-slot                   # a preemption family: no request may end
      patchkit traffic --variant victim-not-freed          # a wrong rendering: is it caught?
      patchkit traffic --repo ~/llama.cpp --base main --candidate my-branch --report-dir out
    """
    from . import build as build_mod
    from . import verify as pipeline
    from .cli import OUTCOME_EXIT

    tr = traffic_mod
    ui = UI(quiet=as_json)
    loads = [tr.load(n) for n in (names or tr.available())]
    if promises_file:
        promises.load(promises_file)   # a bad declaration is refused before anything is built
    r = open_repo(repo, ui)
    base, why = pipeline.choose_base(r, default_base(base_ref, repo), candidate_ref)
    with ui.step("prepare candidate"):
        if variant and (candidate_ref or patch_file or commit):
            raise UsageError("--variant renders a broken variant of a patchkit patch: give it with --patch (or "
                             "alone, for the default patch), not with --candidate, --patch-file or --commit.")
        cand, label, _, _ = pipeline.resolve_candidate(r, base, candidate_ref=candidate_ref, patch_name=patch_name,
                                                       patch_file=patch_file, commit=commit, variant=variant,
                                                       progress=ui.say)
    pipeline.refuse_vacuous(r, base, why, cand, label)
    ui.say(f"base {base[:12]} ({why}); candidate {cand[:12]} ({label})")
    with ui.step("build base and candidate"):
        base_bin = build_mod.build(r, base, progress=ui.progress).binary
        cand_bin = build_mod.build(r, cand, progress=ui.progress).binary
    # its promise (promises.py): a preemption ends no request; an eviction, or a candidate that
    # promises nothing, one request per overflow (the property every eviction keeps)
    declared = promises.of_candidate(r, base, cand, declared=promises_file, within=pipeline.SERIES_DEPTH,
                                     family=promises.rendered_family(patch_name, candidate_ref, patch_file, commit))
    ui.say("promises: " + (declared.text if declared else "none found: one request ended per overflow at most"))
    promise = "preemption" if declared and declared.expect == "preemption" else "one-victim"
    out_dir = (report_dir or Path("patchkit-traffic")).resolve()
    results = []
    for t in loads:
        with ui.step(f"traffic {t.name}"):
            results.append(tr.compare(base_bin, cand_bin, t, out_dir / "logs", promise=promise,
                                      parked_first=bool(declared and declared.own.parked_first),
                                      with_base=not candidate_only, repeat=repeat, say=ui.say))
    doc = {"base": base, "candidate": cand, "candidate_label": label, "promise": tr.PROMISES[promise],
           "promises": declared.text if declared else "",
           "workloads": [tr.to_json(x) for x in results]}
    outcomes = [x.outcome for x in results]
    outcome = "FAIL" if "FAIL" in outcomes else "INCONCLUSIVE" if "INCONCLUSIVE" in outcomes else "PASS"
    doc["outcome"] = outcome
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "traffic.json").write_text(json.dumps(doc, indent=2) + "\n")
    if as_json:
        emit_json(doc)
    else:
        for x in results:
            click.echo(tr.text(x))
        click.echo(f"report: {out_dir / 'traffic.json'}")
        click.echo(outcome)
    sys.exit(OUTCOME_EXIT[outcome])
