"""The fork's nightly mix: the base plus every pr-set.json entry, merged in listed order.

Merged as the fork's prebuilt workflow merges them (docs/DESIGN.md, "The fork's nightly mix"):
each pinned commit with a `--no-ff` merge ("Merge OWNER/llama.cpp#N @ SHA") onto the base plus
the pins before it, conflicts in diff3 style; a conflict is resolved only when every hunk is a
pure addition on both sides (the merge base had no lines there: the union is kept, with a
warning); anything else stops the mix with the nightly's own message naming the pin and the
pins before it. Entries `{"url", "required": false}` are skipped once their PR is not open; a
required entry whose PR is closed or merged is still merged, with a warning.

Nothing here touches a checkout: `git merge-tree --write-tree` (merge-ort, the strategy
`git merge` uses) computes each merge in the object store, a private index resolves add/add
hunks, and `commit-tree` writes the merge commit with a fixed identity and date, so the same
pr-set on the same base gives the same commit SHAs on every machine (a cache key for CI).
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import git

from . import proc
from .errors import RepoError, UsageError
from .pin import OWNERS, PinUrl, parse_url
from .source import BOT, FIXED_DATE, resolve

DIFF3 = ("-c", "merge.conflictStyle=diff3")
PURE_ADD = ("content", "add/add")   # conflict kinds the nightly's resolver may take


@dataclass(frozen=True)
class Entry:
    pin: PinUrl
    required: bool = True

    @property
    def name(self) -> str:
        return f"{self.pin.owner}/llama.cpp#{self.pin.pr}"

    def label(self) -> str:
        return f"{self.name} ({self.pin.sha[:12]})"


@dataclass(frozen=True)
class PrState:
    """What GitHub says about a PR (the workflow writes it with `gh api`; tests write it by hand)."""
    state: str = "open"              # open | closed | merged
    head: str | None = None          # the PR's head commit now
    commits: tuple[str, ...] = ()    # the PR's commits (empty: unknown)


@dataclass(frozen=True)
class Step:
    entry: Entry
    action: str          # merged | skipped | already-in
    commit: str          # the mix after this step
    note: str = ""


@dataclass(frozen=True)
class Mix:
    base: str
    steps: tuple[Step, ...]
    failure: str | None = None       # the nightly's message when an entry does not merge
    failed_entry: Entry | None = None

    @property
    def commit(self) -> str:
        return self.steps[-1].commit if self.steps else self.base

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def warnings(self) -> list[str]:
        return [f"{s.entry.label()}: {s.note}" for s in self.steps if s.note]

    def describe(self) -> str:
        merged = [s.entry.name for s in self.steps if s.action == "merged"]
        return f"base {self.base[:12]}" + "".join(f" + {m}" for m in merged)


def parse(text: str | None, owners: tuple[str, ...] = OWNERS, where: str = "pr-set.json") -> list[Entry]:
    """Every entry, validated (URL shape and allowed owner) before anything is fetched or merged:
    the file comes from a pull request and is untrusted."""
    if not text:
        return []
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{where} is not valid JSON: {e}.")
    prs = data.get("prs") if isinstance(data, dict) else None
    if not isinstance(prs, list):
        raise UsageError(f'{where} has no "prs" list (expected {{"_doc": [...], "prs": [...]}}).')
    out = []
    for i, item in enumerate(prs):
        url = item.get("url") if isinstance(item, dict) else item
        if not isinstance(url, str):
            raise UsageError(f'{where}: entry {i} is neither a URL nor {{"url": ..., "required": false}}.')
        required = item.get("required", True) if isinstance(item, dict) else True
        if not isinstance(required, bool):
            raise UsageError(f'{where}: entry {i} has "required": {json.dumps(required)}; use true or false.')
        out.append(Entry(parse_url(url, owners), required))
    return out


def with_pins(entries: list[Entry], pins: list[PinUrl]) -> list[Entry]:
    """The entries after `patchkit pin` of each pin: a PR already listed keeps its place (and its
    `required`) with the new commit; a new PR is appended."""
    out = list(entries)
    for p in pins:
        k = next((i for i, e in enumerate(out) if (e.pin.owner, e.pin.pr) == (p.owner, p.pr)), None)
        if k is None:
            out.append(Entry(p))
        else:
            out[k] = Entry(p, out[k].required)
    return out


def load_states(path: Path | None) -> dict[str, PrState]:
    """`{"OWNER/llama.cpp#N": {"state": "open", "head": SHA, "commits": [SHA, ...]}}`."""
    if path is None:
        return {}
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"cannot read the PR states file {path}: {e}.")
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: expected an object keyed by OWNER/llama.cpp#N.")
    states = {}
    for k, v in raw.items():
        if not isinstance(v, dict) or v.get("state") not in ("open", "closed", "merged"):
            raise UsageError(f'{path}: {k} needs "state": "open" | "closed" | "merged".')
        states[k] = PrState(v["state"], v.get("head"), tuple(v.get("commits", ())))
    return states


def changed(old: list[Entry], new: list[Entry]) -> list[Entry]:
    """Entries of the new list that the old one did not pin (new PRs and moved commits)."""
    seen = {e.pin.url for e in old}
    return [e for e in new if e.pin.url not in seen]


def _env(index: str | None = None) -> dict[str, str]:
    env = dict(BOT, GIT_AUTHOR_DATE=FIXED_DATE, GIT_COMMITTER_DATE=FIXED_DATE)
    if index:
        env["GIT_INDEX_FILE"] = index
    return env


def _resolve_pure_adds(text: str) -> str | None:
    """The nightly resolver: keep both sides of every diff3 hunk whose base part is empty;
    None when a hunk changed lines the base had (a real conflict)."""
    out, lines, i = [], text.splitlines(keepends=True), 0
    while i < len(lines):
        if not lines[i].startswith("<<<<<<< "):
            out.append(lines[i])
            i += 1
            continue
        ours, base, theirs, part, diff3 = [], [], [], "ours", False
        i += 1
        while i < len(lines) and not lines[i].startswith(">>>>>>> "):
            ln = lines[i]
            if ln.startswith("||||||| "):
                part, diff3 = "base", True
            elif ln.startswith("=======") and ln.rstrip("\n") == "=======":
                part = "theirs"
            else:
                {"ours": ours, "base": base, "theirs": theirs}[part].append(ln)
            i += 1
        if i == len(lines) or base or part != "theirs" or not diff3:
            return None     # unterminated, a base line changed, or no base part to tell
        out += ours + theirs
        i += 1
    return "".join(out)


def _git(repo: git.Repo, *args: str, env: dict[str, str] | None = None, input: str | None = None,
         ok=(0,)) -> proc.Result:
    res = proc.run(["git", *args], cwd=repo.git_dir, env={**os.environ, **_env(), **(env or {})}, input=input,
                   check=False, timeout=300)
    if res.rc not in ok:
        raise RepoError(f"git {args[0]} failed ({res.rc}): {(res.err or res.out).strip()[:300]}")
    return res


def _merge(repo: git.Repo, head: str, entry: Entry) -> tuple[str | None, str]:
    """(merge commit, warning) or (None, why it does not merge)."""
    res = _git(repo, *DIFF3, "merge-tree", "--write-tree", "--name-only", "--messages", head, entry.pin.sha,
               ok=(0, 1))
    head_part, _, messages = res.out.partition("\n\n")
    tree, *files = head_part.strip().splitlines()
    note = ""
    if res.rc == 1:
        kinds = re.findall(r"^CONFLICT \(([^)]+)\)", messages, re.M)
        if any(k not in PURE_ADD for k in kinds):
            return None, f"conflicts ({', '.join(sorted(set(kinds)))}) in {', '.join(files)}"
        with tempfile.TemporaryDirectory(prefix="patchkit-mix.") as tmp:
            index = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            _git(repo, "read-tree", tree, env=index)
            for f in files:
                try:
                    merged = _resolve_pure_adds(_git(repo, "cat-file", "blob", f"{tree}:{f}").out)
                except UnicodeDecodeError:
                    return None, f"a binary file conflicts: {f}"
                if merged is None:
                    return None, f"a conflict in {f} changes lines the merge base had"
                mode = _git(repo, "ls-tree", tree, "--", f).out.split()[0]
                blob = _git(repo, "hash-object", "-w", "--stdin", input=merged).out.strip()
                _git(repo, "update-index", "--cacheinfo", f"{mode},{blob},{f}", env=index)
            tree = _git(repo, "write-tree", env=index).out.strip()
        note = f"add/add conflicts in {', '.join(files)} resolved by keeping both sides (the nightly's resolver)"
    sha = _git(repo, "commit-tree", tree, "-p", head, "-p", entry.pin.sha,
               "-m", f"Merge {entry.name} @ {entry.pin.sha}").out.strip()
    return sha, note


def build_mix(repo: git.Repo, base: str, entries: list[Entry], states: dict[str, PrState] | None = None,
              progress=lambda s: None) -> Mix:
    """The nightly's tree for `entries` on `base`, as commits in `repo`'s object store."""
    base = resolve(repo, base)
    states = states or {}
    steps: list[Step] = []
    head = base
    for e in entries:
        st = states.get(e.name)
        notes = []
        if st and st.state != "open":
            if not e.required:
                steps.append(Step(e, "skipped", head, f"skipped: the PR is {st.state} and the entry is required: false"))
                progress(f"mix: skip {e.label()} ({st.state}, required: false)")
                continue
            notes.append(f"the PR is {st.state} but the entry is required: it is still merged "
                         "(upstream tags lag their merges); delete it once a base tag carries the work")
        if st and st.commits and e.pin.sha not in st.commits:
            raise UsageError(f"{e.label()}: the pinned commit is not one of the PR's commits; pin a commit "
                             f"from https://github.com/{e.pin.owner}/llama.cpp/pull/{e.pin.pr}/commits.")
        if st and st.head and st.head != e.pin.sha:
            notes.append(f"note: the PR's head moved to {st.head[:12]}; only the pinned commit is built")
        try:
            repo.git.cat_file("-e", f"{e.pin.sha}^{{commit}}")
        except git.GitCommandError:
            raise RepoError(f"pinned commit {e.pin.sha} ({e.name}) is not in {repo.working_tree_dir}.",
                            hint=f"Fetch it first: git fetch https://github.com/{e.pin.owner}/llama.cpp "
                                 f"pull/{e.pin.pr}/head")
        if repo.is_ancestor(e.pin.sha, head):
            steps.append(Step(e, "already-in", head, "; ".join(notes + ["already in the mix: the merge is a no-op"])))
            continue
        sha, why = _merge(repo, head, e)
        if sha is None:
            before = [s.entry.name for s in steps if s.action == "merged"]
            msg = (f"{e.name} ({e.pin.sha}) does not merge cleanly onto BASE + the PRs listed before it; "
                   f"reorder or drop it. BASE {base[:12]}, PRs before it: {', '.join(before) or 'none'}; {why}.")
            return Mix(base, tuple(steps), msg, e)
        if why:
            notes.append(why)
        progress(f"mix: merged {e.label()}")
        steps.append(Step(e, "merged", sha, "; ".join(notes)))
        head = sha
    return Mix(base, tuple(steps))
