"""The fork's pin gate: `pin` edits pr-set.json for a verified commit, `ci` judges a pr-set.json
change by the nightlies before and after it (sharded over a CI matrix), `report merge` joins the
shards. Thin: parse, call the library, print.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from . import source, workload
from .cli import cli
from .cli_options import build_options, emit_json, expect_option
from .errors import ReportError, UsageError
from .ui import UI


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
        emit_json({"action": res.action, "url": res.url, "replaced": res.old, "written": res.changed and not dry_run})
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
@expect_option(help="auto: the eviction expectations when the after nightly measurably evicts, the "
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
        emit_json(gate.plan(base=base_ref, old_text=old_text, new_text=new_text or json.dumps(urls),
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
                  opts=build_options(sanitize, None), upstream_tests=up_tests)
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
        emit_json(data)
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
