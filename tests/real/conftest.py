"""Real tier: real git, CMake, compilers, llama-server, HTTP. A missing prerequisite FAILS,
naming what is missing; nothing here is skipped silently."""
import logging
import shutil
import subprocess
from pathlib import Path

import git
import pytest

from toolkit import build, source

REQUIRED = ["git", "cmake", "ninja", "gcc", "g++"]


@pytest.fixture(scope="session", autouse=True)
def prerequisites():
    missing = [p for p in REQUIRED if not shutil.which(p)]
    if missing:
        pytest.fail(f"real tier needs {', '.join(missing)} on PATH (the README's install step provides them)")
    try:
        import clang.cindex  # noqa: F401
    except ImportError:
        pytest.fail("real tier needs the libclang wheel (`pip install libclang`)")


@pytest.fixture(scope="session")
def trees():
    """Fetch (cached) a tree per layout, on first use."""
    cache = {}

    def get(version: str, package: str = "llama-cpp-python") -> source.Tree:
        key = (package, version)
        if key not in cache:
            cache[key] = source.fetch(package, version, progress=logging.getLogger("patchkit.source").info)
        return cache[key]
    return get


@pytest.fixture(scope="session")
def c2(trees):
    return trees(source.DEFAULT_VERSION)


@pytest.fixture(scope="session")
def c2_base(c2):
    """The default tree's llama-server, built once (cached across runs by tree content)."""
    return build.build(git.Repo(c2.path), source.BASELINE_TAG)


def clone(tree: source.Tree, dest: Path) -> git.Repo:
    """A user's checkout: a real clone with its own branch, config and identity."""
    subprocess.run(["git", "clone", "-q", str(tree.path), str(dest)], check=True)
    repo = git.Repo(dest)
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "Test User")
        cw.set_value("user", "email", "test@example.com")
    return repo


def snapshot(repo: git.Repo) -> dict:
    """Everything a refusal must leave byte-identical."""
    return {
        "head": repo.head.commit.hexsha,
        "branch": repo.active_branch.name if not repo.head.is_detached else None,
        "branches": {h.name: h.commit.hexsha for h in repo.heads},
        "status": repo.git.status("--porcelain", "--untracked-files=all"),
        "index": repo.git.ls_files("--stage"),
        "worktrees": repo.git.worktree("list", "--porcelain"),
    }


@pytest.fixture(scope="session")
def c2_patched(c2, c2_base):
    """The default tree with the default patch: commit objects in the cached tree, binary cached."""
    from toolkit import apply
    repo = git.Repo(c2.path)
    sha, _ = apply.candidate_commit(repo, c2.commit)
    return build.build(repo, sha)


# A contributor's identity for commits made in the cache's shared trees (their config has none,
# and CI's fresh HOME has no global one: git refuses "Please tell me who you are")
WHO = {"GIT_AUTHOR_NAME": "dev", "GIT_AUTHOR_EMAIL": "dev@example.com", "GIT_COMMITTER_NAME": "dev",
       "GIT_COMMITTER_EMAIL": "dev@example.com", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000",
       "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000"}


def commit_on(repo: git.Repo, parent: str, files: dict[str, str], msg: str) -> str:
    """A commit of `files` on `parent` (a PR's head, as a contributor would push it), made with a
    private index: the checkout, its index and its refs are not touched."""
    idx = str(Path(repo.git_dir) / "pk-test-index")
    env = {"GIT_INDEX_FILE": idx}
    repo.git.read_tree(parent, env=env)
    for path, text in files.items():
        tmp = Path(repo.git_dir) / "pk-test-blob"
        tmp.write_text(text)
        blob = repo.git.hash_object("-w", str(tmp))
        repo.git.update_index("--add", "--cacheinfo", f"100644,{blob},{path}", env=env)
    tree = repo.git.write_tree(env=env)
    return repo.git.commit_tree(tree, "-p", parent, "-m", msg, env=WHO)


def blocked_eviction(repo: git.Repo, base: str) -> str:
    """A wrong patch that deadlocks silently: the default patch whose eviction then waits on a
    condition nobody signals. Its server stays alive and its HTTP threads go on (they ping the
    open streams), but its loop writes nothing more: no token, no log line."""
    from toolkit import apply
    cand, an = apply.candidate_commit(repo, base)
    text = repo.git.show(f"{cand}:{an.file}")
    anchor = "        n_kv_full_evictions++;\n"
    assert text.count(anchor) == 1
    hang = ("        { std::mutex m; std::condition_variable cv; std::unique_lock<std::mutex> lock(m);\n"
            "          cv.wait(lock, [] { return false; }); }\n")
    return commit_on(repo, cand, {an.file: text.replace(anchor, anchor + hang) + "\n"},
                     "a wrong patch: the eviction waits for good")


def broken_variant(tree: source.Tree, tmp_path: Path, patch_name: str, variant: str, wl: str) -> dict[str, str]:
    """A family's broken variant (patch.toml [variants.*]) built on `tree` (one TU on the shared base
    build) and judged by the suite on workload `wl` with that family's own promises: {check: reason}
    of every check that killed it. It must be killed."""
    from toolkit import apply, mutate, workload

    repo = git.Repo(tree.path)
    base = source.resolve(repo, source.BASELINE_TAG)
    right, an = apply.candidate_commit(repo, base, patch_name)
    # a mutant not reached (every start missed the shape its killer judges: a client descheduled
    # past a park) is judged once more, never counted as killed or ALIVE
    for attempt in range(2):
        res = mutate.run_mutant(repo, base, variant, mutate.catalog(patch_name)[variant], [workload.load(wl)],
                                repeat=1, right_tree=repo.commit(right).tree, layout=an.facts.layout,
                                opts=build.Options(), out_dir=tmp_path / f"attempt{attempt}", reuse={},
                                say=lambda s: None, progress=lambda s: None, patch_name=patch_name, judges=("suite",))
        if res.status != "not-reached":
            break
    assert res.status == "killed", res
    return {k.check: k.reason for k in res.kills}


# the TU the patch changes (all of its code) and the KV cache whose cells it frees
SANITIZE_SCOPE = ("tools/server/server-context.cpp",) + build.KV_CACHE_SOURCES


def sanitized_build(tree: source.Tree, sha: str) -> dict:
    """`sha` built with ASan+UBSan on SANITIZE_SCOPE, through the command a user types (`patchkit
    build --sanitize ... --sanitize-only ... --json`): its JSON answer (binary, reused, ...)."""
    import json
    import sys

    res = subprocess.run([sys.executable, "-m", "toolkit", "build", "--repo", str(tree.path), "--ref", sha, "--sanitize",
                          "address,undefined", *sum((["--sanitize-only", f] for f in SANITIZE_SCOPE), []), "--json"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)
