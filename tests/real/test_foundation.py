"""Issue 2: the real loop on the unpatched default tree."""
import json
import os
import subprocess
import sys

import git

from toolkit import build, source
from toolkit.compare import EXCEEDED

from .conftest import clone, snapshot


def patchkit(*args, check=False, **kw):
    return subprocess.run([sys.executable, "-m", "toolkit", *args], capture_output=True, text=True, check=check, **kw)


def test_source_fetch_is_cached(c2, tmp_path):
    """A cached tree is served from the cache: pip (the only network patchkit uses) never runs.
    Here `python -m pip` is a stub that fails, so a download attempt would fail the command."""
    stub = tmp_path / "nopip" / "pip"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("")
    (stub / "__main__.py").write_text("import sys\nsys.exit('pip must not run for a cached tree')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(stub.parent), os.environ.get("PYTHONPATH")])))
    probe = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True, env=env)
    assert probe.returncode != 0 and "must not run" in probe.stderr, "the stub must shadow pip, or this proves nothing"
    head = git.Repo(c2.path).head.commit.hexsha
    res = patchkit("source", "fetch", env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == str(c2.path)
    said = []
    again = source.fetch(progress=said.append)
    assert not again.fetched and said == [], said  # nothing downloaded, nothing extracted
    assert again.path == c2.path and again.commit == c2.commit
    repo = git.Repo(c2.path)
    assert repo.head.commit.hexsha == head
    assert repo.git.rev_parse(source.BASELINE_TAG) == c2.commit
    assert "vendor/llama.cpp baseline" in repo.commit(c2.commit).message


def test_build_produces_server_and_compile_commands(c2_base):
    assert c2_base.binary.exists()
    assert c2_base.workspace.compile_commands.exists()
    db = json.loads(c2_base.workspace.compile_commands.read_text())
    assert any(e["file"].endswith("server-context.cpp") for e in db)
    out = subprocess.run([str(c2_base.binary), "--version"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    # the optimisation levels (build.OPT_FLAGS): ggml's kernels at -O3 through ggml's project
    # include, every other TU at -O1, as CMake wrote them (the compile commands the checks use)
    levels: dict[str, set[str]] = {}
    for e in db:
        rel = os.path.relpath(e["file"], c2_base.workspace.src)
        flags = [a for a in e["command"].split() if a in ("-O0", "-O1", "-O2", "-O3")]
        levels.setdefault("ggml" if rel.startswith("ggml/") else "other", set()).add(" ".join(flags))
    assert levels == {"ggml": {"-O3"}, "other": {"-O1"}}, levels


def test_second_build_is_reused(c2, c2_base):
    again = build.build(git.Repo(c2.path), source.BASELINE_TAG)
    assert again.reused and again.binary == c2_base.binary


def test_two_fresh_clones_share_one_build_and_leave_no_workspace(c2, c2_base, tmp_path):
    """Issue 37: one build per tree content, never per clone. Two clones of the default tree at
    two paths build nothing (the binary store is keyed by tree), and add no workspace to the cache
    (workspaces are keyed by history, so both clones name the default tree's own)."""
    from toolkit import cache
    work = cache.root() / "work"
    history = build.workspace_root(git.Repo(c2.path), build.Options()).name.split("-")[0]
    # this tree's workspaces only: another test process (ci/run.sh's -n 2) may build another tree meanwhile

    def ours() -> set:
        return {p for p in work.iterdir() if p.name.startswith(history)} if work.exists() else set()
    before = ours()
    for name in ("one", "two"):
        repo = clone(c2, tmp_path / name)
        got = build.build(repo, source.BASELINE_TAG)
        assert got.reused and got.binary == c2_base.binary, name
        assert build.workspace_root(repo, build.Options()) == build.workspace_root(git.Repo(c2.path), build.Options())
    assert ours() == before


def test_baseline_overflow_4_reproduces_the_bug(c2_base, tmp_path):
    res = patchkit("verify", "--baseline-only", "--workload", "overflow-4", "--report-dir", str(tmp_path), "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    rep = json.loads(res.stdout)
    run = rep["workloads"]["overflow-4"]["base"][0]
    assert [o["outcome"] for o in run["outcomes"]] == ["errored"] * 4
    assert {o["error"] for o in run["outcomes"]} == {EXCEEDED}
    assert all(not o["done_seen"] for o in run["outcomes"]), "an in-band error ends the stream without [DONE]"
    assert run["alive_after"] and run["followup_ok"]
    assert (tmp_path / "report.md").exists() and (tmp_path / "report.html").exists()


def test_building_another_ref_leaves_the_checkout_alone(c2, c2_base, tmp_path):
    repo = clone(c2, tmp_path / "user")
    f = tmp_path / "user" / "tools/server/server-context.cpp"
    repo.git.checkout("-q", "-b", "feature")
    f.write_text(f.read_text() + "\n// a user's change\n")
    repo.git.commit("-qam", "feature")
    repo.git.checkout("-q", "main")
    (tmp_path / "user" / "notes.txt").write_text("untracked, must survive\n")
    before = snapshot(repo)
    res = patchkit("build", "--repo", str(tmp_path / "user"), "--ref", "feature", "--build-dir", str(tmp_path / "ws"))
    assert res.returncode == 0, res.stderr[-2000:]
    binary = res.stdout.strip().splitlines()[-1]
    assert binary.endswith("llama-server")
    assert snapshot(repo) == before
    assert (tmp_path / "user" / "notes.txt").read_text() == "untracked, must survive\n"
