"""Apply a patch to a repository as a series of commits on a new branch; check; revert.

Nothing here writes to the user's working tree except the final `git checkout` of the new
branch, which git itself performs on a clean tree. Commits are built with plumbing
(hash-object, a private index, commit-tree), so a refusal or failure at any earlier point
leaves the checkout, branch and index exactly as they were.
"""
from __future__ import annotations

import difflib
import json
import re
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import git

from . import build as build_mod
from . import anchors, cache, codeindex, patch
from .errors import LayoutError, PatchError, RepoError, UsageError
from .source import BOT, current_branch, dirty_files, resolve
from .ui import log_progress

TRAILER_PATCH = "Patchkit-Patch"
# A candidate patchkit did not render (a user's diff): named, but never read as a patch family.
TRAILER_CANDIDATE = "Patchkit-Candidate"
TRAILER_RETURN = "Patchkit-Return-To"


@dataclass(frozen=True)
class Analysis:
    commit: str
    file: str
    state: str                    # clean | applied | partial
    facts: anchors.Facts | None     # None when already applied
    source: bytes
    workspace: build_mod.Workspace


@dataclass(frozen=True)
class Applied:
    status: str                   # applied | already-applied | checked (no write)
    layout: str | None
    branch: str | None
    base_commit: str
    head_commit: str | None       # tip of the series
    commits: tuple[str, ...]
    file: str
    diff: str
    seconds: float


def analyze(repo: git.Repo, commit: str, spec: patch.PatchSpec, opts: build_mod.Options = build_mod.Options(),
            progress=log_progress) -> Analysis:
    """Configure (if needed) a private work tree at `commit`, parse the server TU, read the layout."""
    _precheck(repo, commit)
    with build_mod.held(repo, commit, opts, progress) as ws:
        rel = anchors.find_server_file(ws.src)
        text = (ws.src / rel).read_bytes()
        st = patch.state(text.decode(errors="replace"), spec)
        if st != "clean":
            return Analysis(commit, rel, st, None, text, ws)
        try:
            cmd = ws.compile_command(rel)
        except PatchError:
            cmd = None
        if cmd is not None:
            return Analysis(commit, rel, st, _facts(ws, rel, cmd, text, progress), text, ws)
    # stale or broken database: configure once more, then believe it
    progress("compile_commands.json has no entry for the server TU; re-running CMake")
    with build_mod.held(repo, commit, opts, progress, reconfigure=True) as ws:
        return Analysis(commit, rel, st, _facts(ws, rel, ws.compile_command(rel), text, progress), text, ws)


def _facts(ws: build_mod.Workspace, rel: str, cmd: codeindex.CompileCommand, text: bytes, progress) -> anchors.Facts:
    """The layout facts, parsed once per (tree, flags, analysing code): the libclang parse is ~3 s
    of every warm verify otherwise. Keyed by the whole tree (headers shape the AST too) and by the
    source of the modules that derive the facts, so editing them invalidates the entry."""
    import importlib.metadata

    code = "".join(Path(m.__file__).read_text() for m in (codeindex, anchors))
    flags = [a.replace(str(ws.root), "<workspace>") for a in cmd.argv]  # where it is configured is no fact
    key = cache.digest(ws.tree, rel, flags, importlib.metadata.version("libclang"), code)
    path = cache.sub("facts") / f"{key}.json"
    try:
        return anchors.Facts(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        pass  # absent, or written by an older shape of Facts: parse
    progress(f"parsing {rel} with libclang")
    facts = anchors.analyze(codeindex.parse(cmd), text, rel)
    cache.write_atomic(path, json.dumps(asdict(facts)))
    return facts


def _precheck(repo: git.Repo, commit: str) -> None:
    """Refuse in a second, before any configure, a tree whose server has no context-exceeded
    error at all: there is nothing for the AST anchors to find (e.g. ik_llama.cpp, layout E)."""
    for rel in anchors.SERVER_FILES:
        try:
            text = repo.git.show(f"{commit}:{rel}").encode()
        except git.GitCommandError:
            continue
        if anchors.precheck(rel, text):
            return
    raise LayoutError(f"no server decode loop found at {commit[:12]} (looked in {', '.join(anchors.SERVER_FILES)}).",
                            hint="Is this a llama.cpp tree?")


def _git_env(index: Path | None = None) -> dict[str, str]:
    env = dict(BOT)
    if index is not None:
        env["GIT_INDEX_FILE"] = str(index)
    return env


def commit_series(repo: git.Repo, base: str, rel: str, texts: list[tuple[int, bytes]], spec: patch.PatchSpec,
                  policy: str, trailers: dict[str, str]) -> list[str]:
    """One commit per (stage, text), chained on `base`; returns their SHAs. No ref, no worktree touched."""
    commits, parent = [], base
    with tempfile.TemporaryDirectory(prefix="patchkit-index-") as tmp:
        index = Path(tmp) / "index"
        g = repo.git
        with g.custom_environment(**_git_env(index)):
            g.read_tree(base)
            for stage, text in texts:
                blob_file = Path(tmp) / "blob"
                blob_file.write_bytes(text)
                blob = g.hash_object("-w", str(blob_file))
                mode = g.ls_files("-s", "--", rel).split(" ")[0] or "100644"
                g.update_index("--cacheinfo", f"{mode},{blob},{rel}")
                tree = g.write_tree()
                title, body = spec.stages[stage - 1]
                msg = f"{title}\n\n{body.format(policy=policy, policy_what=spec.policy_what[policy])}\n\n" + "".join(
                    f"{k}: {v}\n" for k, v in {**trailers, "Patchkit-Stage": str(stage)}.items())
                parent = g.commit_tree(tree, "-p", parent, "-m", msg)
                commits.append(parent)
    return commits


def commit_text(repo: git.Repo, parent: str, rel: str, data: bytes, message: str) -> str:
    """One commit on `parent` with `rel` replaced by `data`, written with git plumbing into a private
    index (no ref, no worktree touched). The operator campaign's schema is one."""
    with tempfile.TemporaryDirectory(prefix="patchkit-index-") as tmp:
        g = repo.git
        with g.custom_environment(**_git_env(Path(tmp) / "index")):
            g.read_tree(parent)
            blob_file = Path(tmp) / "blob"
            blob_file.write_bytes(data)
            blob = g.hash_object("-w", str(blob_file))
            mode = g.ls_files("-s", "--", rel).split(" ")[0] or "100644"
            g.update_index("--add", "--cacheinfo", f"{mode},{blob},{rel}")   # --add: `rel` may be new
            return g.commit_tree(g.write_tree(), "-p", parent, "-m", message)


def _diff(rel: str, before: bytes, after: bytes) -> str:
    return "".join(difflib.unified_diff(before.decode(errors="replace").splitlines(True),
                                        after.decode(errors="replace").splitlines(True),
                                        fromfile=f"a/{rel}", tofile=f"b/{rel}"))


def candidate_commit(repo: git.Repo, base: str, patch_name: str = patch.DEFAULT_PATCH, policy: str = "largest",
                     variant: str | None = None, opts: build_mod.Options = build_mod.Options(),
                     progress=log_progress) -> tuple[str, Analysis]:
    """The patched series on `base` as commit objects only (verify's default candidate)."""
    spec = patch.load_patch(patch_name)
    an = analyze(repo, base, spec, opts, progress)
    if an.state == "applied":
        return base, an
    if an.state == "partial":
        raise PatchError(f"{an.file} at {base[:12]} carries only part of '{spec.name}' (one of its two definitions).")
    texts = patch.stage_texts(an.source, an.facts, spec, policy, variant)
    commits = commit_series(repo, base, an.file, texts, spec, policy,
                            {TRAILER_PATCH: f"{spec.name} policy={policy}" + (f" variant={variant}" if variant else "")})
    return commits[-1], an


def apply(repo: git.Repo, *, patch_name: str = patch.DEFAULT_PATCH, policy: str = "largest",
          branch: str | None = None, check: bool = False, variant: str | None = None,
          opts: build_mod.Options = build_mod.Options(), progress=log_progress) -> Applied:
    start = time.monotonic()
    spec = patch.load_patch(patch_name)
    if policy not in spec.policies:
        raise UsageError(f"unknown policy '{policy}'; choose from {', '.join(spec.policies)}.")
    dirty = dirty_files(repo)
    if dirty and not check:
        raise RepoError("the working tree has uncommitted changes; refusing to touch it. Files: "
                        + ", ".join(dirty[:10]) + (" ..." if len(dirty) > 10 else "") + ".",
                        hint="Commit or stash them first; nothing was changed.")
    base = resolve(repo, "HEAD")
    return_to = current_branch(repo) or base
    branch = branch or f"patchkit/{spec.name}" + ("" if policy == "largest" else f"-{policy}")
    an = analyze(repo, base, spec, opts, progress)
    if an.state == "applied":
        return Applied("already-applied", None, current_branch(repo), base, base, (), an.file, "",
                       time.monotonic() - start)
    if an.state == "partial":
        raise PatchError(f"{an.file} carries only part of '{spec.name}' (one of its two definitions is missing): "
                         "it was edited after patching.", hint="Restore the file or revert to the base branch.")
    texts = patch.stage_texts(an.source, an.facts, spec, policy, variant)
    diff = _diff(an.file, an.source, texts[-1][1])
    if check:
        return Applied("checked", an.facts.layout, None, base, None, (), an.file, diff, time.monotonic() - start)
    if branch in [h.name for h in repo.heads]:
        raise RepoError(f"branch '{branch}' already exists; refusing to overwrite it.",
                        hint=f"Pass --branch NEW, or `patchkit apply --revert` / `git branch -D {branch}`.")
    commits = commit_series(repo, base, an.file, texts, spec, policy,
                            {TRAILER_PATCH: f"{spec.name} policy={policy}", TRAILER_RETURN: return_to})
    repo.git.branch(branch, commits[-1])
    try:
        repo.git.checkout(branch)
    except git.GitCommandError as e:
        repo.git.branch("-D", branch)
        raise RepoError(f"could not check out {branch}: {e.stderr.strip()}")
    return Applied("applied", an.facts.layout, branch, base, commits[-1], tuple(commits), an.file, diff,
                   time.monotonic() - start)


def revert(repo: git.Repo, branch: str | None = None) -> tuple[str, bool]:
    """Check out the branch apply started from. The patch branch is deleted when it holds only
    patchkit's commits, kept (and said so) when someone committed on top of it.
    Returns (where we returned to, whether the branch was deleted)."""
    dirty = dirty_files(repo)
    if dirty:
        raise RepoError("the working tree has uncommitted changes; refusing to switch branches. Files: "
                        + ", ".join(dirty[:10]) + ".", hint="Commit or stash them first; nothing was changed.")
    branch = branch or current_branch(repo)
    if not branch or branch not in [h.name for h in repo.heads]:
        raise RepoError(f"no patch branch to revert ({branch or 'detached HEAD'}).",
                        hint="Pass --branch patchkit/evict-largest-slot.")
    foreign, c = 0, repo.heads[branch].commit
    while not _trailer(c.message, TRAILER_RETURN):
        if not c.parents or foreign > 1000:
            raise RepoError(f"branch '{branch}' was not made by patchkit apply (no {TRAILER_RETURN} trailer).")
        foreign += 1
        c = c.parents[0]
    ret = _trailer(c.message, TRAILER_RETURN)
    repo.git.checkout(ret)
    if foreign == 0:
        repo.git.branch("-D", branch)
    return ret, foreign == 0


def series_base(repo: git.Repo, commit: str, *, within: int = 0) -> str | None:
    """The commit a patchkit series was applied on, when `commit` is (the tip of) such a series:
    walk first parents while they carry the Patchkit-Patch trailer. None when it carries none.
    `within` > 0 also accepts a series up to that many first-parent commits below `commit`
    (someone committed on top of the patch branch: `commit` still carries the series)."""
    c = repo.commit(commit)
    for _ in range(within):
        if _trailer(c.message, TRAILER_PATCH) or not c.parents:
            break
        c = c.parents[0]
    seen = 0
    while _trailer(c.message, TRAILER_PATCH) and c.parents:
        c, seen = c.parents[0], seen + 1
    return c.hexsha if seen else None


def _trailer(message: str, key: str) -> str | None:
    m = re.search(rf"^{re.escape(key)}: (.+)$", message, re.M)
    return m.group(1).strip() if m else None


# ------------------------------------------------------------------ candidates that are not ours

def from_patch_file(repo: git.Repo, base: str, patch_file: Path) -> str:
    """`git apply --cached` onto `base` in a private index; one commit. Refuses on conflict."""
    patch_file = Path(patch_file).resolve()
    if not patch_file.is_file():
        raise UsageError(f"patch file {patch_file} does not exist.")
    with tempfile.TemporaryDirectory(prefix="patchkit-index-") as tmp:
        g = repo.git
        with g.custom_environment(**_git_env(Path(tmp) / "index")):
            g.read_tree(base)
            try:
                g.apply("--cached", "--whitespace=nowarn", str(patch_file))
            except git.GitCommandError as e:
                # git's own lines ("error: patch failed: FILE:LINE"), without GitPython's wrapping
                why = "; ".join(re.findall(r"error: (.+?)(?:'?\s*$)", e.stderr, re.M)) or e.stderr.strip()
                raise PatchError(f"{patch_file.name} does not apply to {base[:12]}: {why[:400]}.",
                                 hint="Rebase the change onto the base, or pass the base it was made on with --base.")
            tree = g.write_tree()
            return g.commit_tree(tree, "-p", base, "-m", f"patchkit candidate: {patch_file.name}\n\n"
                                 f"{TRAILER_CANDIDATE}: patch-file {patch_file.name}\n")


def from_commit(repo: git.Repo, base: str, commit: str) -> str:
    """Merge `commit` into `base`, as a fork's nightly merges a pinned PR commit (no worktree)."""
    sha = resolve(repo, commit)
    if repo.is_ancestor(sha, base):
        return base
    try:
        tree = repo.git.merge_tree("--write-tree", base, sha).splitlines()[0]
    except git.GitCommandError as e:
        raise PatchError(f"merging {sha[:12]} into {base[:12]} conflicts: {e.stdout.strip()[:400]}",
                         hint="The pinned commit needs a rebase onto this base.")
    with repo.git.custom_environment(**BOT):
        return repo.git.commit_tree(tree, "-p", base, "-p", sha, "-m",
                                    f"patchkit candidate: merge {sha[:12]} into {base[:12]}\n")
