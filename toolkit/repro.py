"""`patchkit repro`: a self-contained bash script a reviewer runs on a fresh machine.

The script installs patchkit in a venv, obtains the same tree (the same PyPI sdist, or the
repo's remote at the same commit), brings the candidate (the named patch, or the exact diff
embedded in the script), builds both, runs the workloads and prints the before/after table;
with traffic workloads, then the users' chat traffic on both (`patchkit traffic`), the users'
turns before and after.
Every interpolated value goes through shlex.quote.
"""
from __future__ import annotations

import base64
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import git
import jinja2

from .errors import UsageError
from .source import BASELINE_TAG, resolve

TEMPLATE = jinja2.Environment(loader=jinja2.PackageLoader("toolkit", "templates"), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)


def default_spec() -> str:
    """This patchkit's own source tree when it runs from one (the name 'patchkit' on PyPI is not us)."""
    top = Path(__file__).resolve().parent.parent
    return str(top) if (top / "pyproject.toml").exists() else "patchkit"
TEMPLATE.filters["q"] = lambda v: shlex.quote(str(v))


@dataclass(frozen=True)
class TreeOrigin:
    kind: str              # sdist | git
    package: str = ""
    version: str = ""
    url: str = ""
    commit: str = ""


def origin(repo: git.Repo, base: str) -> TreeOrigin:
    """How a reviewer gets the same base tree."""
    try:
        tag = repo.git.rev_parse(f"{BASELINE_TAG}^{{commit}}")
    except git.GitCommandError:
        tag = None
    if tag == base:
        m = re.match(r"(\S+) (\S+): vendor/llama.cpp baseline", repo.commit(base).message)
        if m:
            return TreeOrigin("sdist", package=m.group(1), version=m.group(2))
    remotes = {r.name: r.url for r in repo.remotes}
    url = remotes.get("origin") or next(iter(remotes.values()), None)
    if not url or Path(url).exists():
        raise UsageError("repro needs a base a reviewer can obtain: a tree from `patchkit source fetch` (at its "
                         "baseline) or a repository whose 'origin' remote is a URL.")
    return TreeOrigin("git", url=url, commit=base)


def render(repo: git.Repo, *, base_ref: str | None, candidate_ref: str | None = None, patch_name: str | None = None,
           patch_file: Path | None = None, commit: str | None = None, workloads: list[str], repeat: int = 1,
           patchkit_spec: str = "patchkit", traffic: list[str] = ()) -> str:
    from .verify import choose_base
    base, _ = choose_base(repo, base_ref, candidate_ref)
    org = origin(repo, base)
    diff = None
    if candidate_ref or commit:
        # the exact change, embedded: the reviewer needs no access to the commit
        target = resolve(repo, candidate_ref or commit)
        diff = repo.git.diff("--binary", f"{base}...{target}") + "\n"
        label = f"{'ref ' + candidate_ref if candidate_ref else 'commit ' + target[:12]} (diff embedded)"
    elif patch_file:
        diff = Path(patch_file).read_text()
        label = f"patch file {Path(patch_file).name} (embedded)"
    else:
        label = f"patch {patch_name or 'evict-largest-slot'}"
    return TEMPLATE.get_template("repro.sh.j2").render(
        origin=org, patch_name=patch_name or "evict-largest-slot", label=label, workloads=workloads, repeat=repeat,
        traffic=list(traffic),
        diff_b64=base64.b64encode(diff.encode()).decode() if diff else None, patchkit_spec=patchkit_spec)
