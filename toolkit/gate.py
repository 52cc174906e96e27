"""The pin gate: what the GitHub workflow runs, and what anyone can run locally.

For every pin that a change to pr-set.json adds or moves (or one URL given by hand): merge the
pinned commit into the base as the fork's nightly does, build base and candidate, run the
suite, write reports, and say pass/fail per pin. The workflow (ci/pin-gate.yml) only fetches
code and calls `patchkit ci`; all logic lives here, so the job is tested for real.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import git

from . import report, workload
from . import verify as pipeline
from .errors import RepoError, UsageError
from .pin import PinUrl, parse_url


@dataclass(frozen=True)
class GateResult:
    pin: PinUrl
    ok: bool
    report_dir: Path
    markdown: str


def _urls(text: str | None) -> list[str]:
    if not text:
        return []
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"pr-set file is not valid JSON: {e}.")
    out = []
    for item in data.get("prs", []):
        url = item.get("url") if isinstance(item, dict) else item
        if isinstance(url, str):
            out.append(url)
    return out


def changed_pins(old_text: str | None, new_text: str, owners: tuple[str, ...]) -> list[PinUrl]:
    """Pins in `new_text` that `old_text` did not have (new PRs and moved commits)."""
    old = set(_urls(old_text))
    return [parse_url(u, owners) for u in _urls(new_text) if u not in old]


def gate(repo: git.Repo, pins: list[PinUrl], *, base_ref: str | None, out_dir: Path, ui, repeat: int = 1,
         workloads: list[str] | None = None) -> list[GateResult]:
    results = []
    for p in pins:
        try:
            repo.git.cat_file("-e", f"{p.sha}^{{commit}}")
        except git.GitCommandError:
            raise RepoError(f"pinned commit {p.sha} (PR {p.owner}#{p.pr}) is not in {repo.working_tree_dir}.",
                            hint=f"Fetch it first: git fetch https://github.com/{p.owner}/llama.cpp "
                                 f"pull/{p.pr}/head")
        d = out_dir / f"{p.owner}-{p.pr}-{p.sha[:12]}"
        ui.say(f"==> pin {p.owner}#{p.pr} at {p.sha[:12]}")
        wls = [workload.load(w) for w in (workloads or pipeline.SUITE)]
        res = pipeline.verify(repo, base_ref=base_ref, commit=p.sha, workloads=wls, repeat=repeat, out_dir=d, ui=ui)
        paths = report.write(res, d)
        md = f"### {p.owner}#{p.pr} `{p.sha[:12]}`: {'PASS' if res.ok else 'FAIL'}\n\n" + paths["md"].read_text()
        results.append(GateResult(p, res.ok, d, md))
    return results
