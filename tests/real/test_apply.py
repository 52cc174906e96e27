"""Issue 3: the apply engine on real trees of every layout, plus its refusals."""
import subprocess
import sys
import time

import pytest

from toolkit import apply, build, check, patch, sensitivity
from toolkit.errors import LayoutError, RepoError

from .conftest import clone, snapshot

LAYOUTS = {"0.3.16": "A", "0.3.28": "B", "0.3.32": "C", "0.3.35": "C2", "0.3.36": "D"}
TIMES: dict[str, tuple[float, float]] = {}


# the tree's shared workspace (keyed by its history, issue 37): configured once, not per test (a
# private one cost each test a checkout and a CMake configure); a private workspace (`--build-dir`)
# is exercised by test_faults and test_foundation, and below by the facts' cache
OPTS = build.Options()


@pytest.mark.parametrize("version", list(LAYOUTS))
def test_layout_matrix(trees, tmp_path, version):
    tree = trees(version)
    repo = clone(tree, tmp_path / "repo")
    main_sha = repo.head.commit.hexsha
    t = time.monotonic()
    res = apply.apply(repo, opts=OPTS)
    t_apply = time.monotonic() - t
    assert res.status == "applied" and res.layout == LAYOUTS[version]
    assert repo.active_branch.name == "patchkit/evict-largest-slot"
    assert repo.heads["main"].commit.hexsha == main_sha, "the user's branch must not move"
    assert len(res.commits) == 1  # one complete commit: it builds and runs on its own
    assert repo.git.status("--porcelain") == ""
    text = (tmp_path / "repo" / res.file).read_text()
    assert patch.state(text, patch.load_patch()) == "applied"
    # the n_cmpl hand-over's guard (B to D), by the view's own size: B's handler restores n_batch
    # to the full size before that loop, so there it is the size the view was cut with
    view = {"A": None, "B": "i + n_tokens"}.get(LAYOUTS[version], "off + n_batch")
    assert ("a batch that did not fit the KV cache is decoded in several views" in text) == (view is not None)
    assert view is None or f"if (slot.i_batch >= {view}) {{\n" in text
    # a victim that led the batch hands that role on where decode() reads it per view (C)
    assert ("if (batch.slot_batched == victim) {" in text) == (LAYOUTS[version] == "C")

    again = apply.apply(repo, opts=OPTS)
    assert again.status == "already-applied" and repo.head.commit.hexsha == res.head_commit

    t = time.monotonic()
    ck = check.check(repo, opts=OPTS)
    TIMES[version] = (t_apply, time.monotonic() - t)
    assert not ck.errors, ck.errors
    assert not ck.new_warnings, ck.new_warnings
    assert all(c.status == "pass" for c in ck.static), ck.static

    # the perturbation harness (the witness's sensitivity, in every report) compiles against this
    # tree's llama.h: A's has `flash_attn` where later trees have `flash_attn_type`
    harness = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", f"-I{tree.path}/include",
                              f"-I{tree.path}/ggml/include", str(sensitivity.SOURCE)], capture_output=True, text=True)
    assert harness.returncode == 0, harness.stderr[-2000:]

    where, deleted = apply.revert(repo)
    assert where == "main" and deleted
    assert repo.active_branch.name == "main" and repo.head.commit.hexsha == main_sha
    assert repo.git.diff(tree.commit, "--stat") == "" and repo.git.status("--porcelain") == ""
    print(f"layout {LAYOUTS[version]}: apply {t_apply:.1f} s, check {TIMES[version][1]:.1f} s")


def test_ik_llama_cpp_is_refused_with_its_reason(trees, tmp_path):
    repo = clone(trees("0.1.5", "ik-llama-cpp-python"), tmp_path / "ik")
    before = snapshot(repo)
    res = subprocess.run([sys.executable, "-m", "toolkit", "apply", "--repo", str(tmp_path / "ik")],
                         capture_output=True, text=True)
    assert res.returncode == LayoutError.exit_code
    assert "ik_llama.cpp (layout E)" in res.stderr and "process_batch_tokens" in res.stderr
    assert "n_batch == 1 && ret == 1" in res.stderr
    assert snapshot(repo) == before


def test_dirty_tree_refused_and_untouched(c2, tmp_path):
    repo = clone(c2, tmp_path / "repo")
    f = tmp_path / "repo" / "tools/server/server-context.cpp"
    edited = f.read_bytes() + b"\n// work in progress\n"
    f.write_bytes(edited)
    (tmp_path / "repo" / "scratch.txt").write_bytes(b"mine\n")
    before = snapshot(repo)
    res = subprocess.run([sys.executable, "-m", "toolkit", "apply", "--repo", str(tmp_path / "repo")],
                         capture_output=True, text=True)
    assert res.returncode == RepoError.exit_code
    assert "tools/server/server-context.cpp" in res.stderr and "scratch.txt" in res.stderr
    assert snapshot(repo) == before
    assert f.read_bytes() == edited and (tmp_path / "repo" / "scratch.txt").read_bytes() == b"mine\n"


def test_unknown_layout_names_the_missing_anchor(c2, tmp_path):
    repo = clone(c2, tmp_path / "repo")
    f = tmp_path / "repo" / "tools/server/server-context.cpp"
    f.write_text(f.read_text().replace("n_batch == 1 && ret == 1", "n_batch == 0"))
    repo.git.commit("-qam", "a fork that reworked the handler")
    before = snapshot(repo)
    with pytest.raises(LayoutError) as e:
        apply.apply(repo, opts=OPTS)
    assert "`n_batch == 1 && ret == 1` branch" in str(e.value)
    assert snapshot(repo) == before


def test_layout_facts_are_parsed_once_per_tree(c2, tmp_path, monkeypatch):
    repo = clone(c2, tmp_path / "repo")
    spec = patch.load_patch()
    first = apply.analyze(repo, c2.commit, spec, OPTS)  # parses (or an earlier test did)

    def no_parse(cmd):
        raise AssertionError("parsed again")
    monkeypatch.setattr(apply.codeindex, "parse", no_parse)
    # same tree, another workspace: the cached facts, no libclang
    again = apply.analyze(repo, c2.commit, spec, build.Options(workdir=tmp_path / "ws2"))
    assert again.facts == first.facts and again.facts.layout == "C2"
    # a change anywhere in the tree (a header shapes the AST too) is a new key: parsed again
    h = tmp_path / "repo" / "tools/server/server-context.h"
    h.write_text(h.read_text() + "\n// a fork's edit\n")
    repo.git.commit("-qam", "header edit")
    with pytest.raises(AssertionError, match="parsed again"):
        apply.analyze(repo, repo.head.commit.hexsha, spec, OPTS)


def test_check_flag_writes_nothing(c2, tmp_path):
    repo = clone(c2, tmp_path / "repo")
    before = snapshot(repo)
    res = apply.apply(repo, check=True, opts=OPTS)
    assert res.status == "checked" and res.diff.startswith("--- a/tools/server/server-context.cpp")
    assert f"+    bool {patch.HELPER}(int32_t off) {{" in res.diff
    assert snapshot(repo) == before


@pytest.mark.parametrize("policy", ["smallest", "newest"])
def test_other_policies_render_and_compile(c2, tmp_path, policy):
    repo = clone(c2, tmp_path / "repo")
    res = apply.apply(repo, policy=policy, opts=OPTS)
    assert res.branch == f"patchkit/evict-largest-slot-{policy}"
    ck = check.check(repo, opts=OPTS)
    assert ck.ok, (ck.errors, ck.new_warnings, ck.static)


def test_static_check_catches_the_broken_variant(c2, tmp_path):
    """`check` must be able to fail: the no-remap variant is flagged."""
    repo = clone(c2, tmp_path / "repo")
    sha, _ = apply.candidate_commit(repo, c2.commit, variant="no-remap", opts=OPTS)
    ck = check.check(repo, sha, opts=OPTS)
    assert not ck.errors
    failed = {c.name for c in ck.static if c.status == "fail"}
    assert "indices-remapped" in failed and not ck.ok


def test_a_warning_in_the_patch_is_named_by_a_compile_and_by_its_cached_replay(c2, tmp_path, monkeypatch):
    """`check` compiles through ccache (issue 37): the second compile of the same TU is a hit, and
    the hit must replay the compiler's diagnostics, or a warning in the patch would pass once cached.
    A private ccache directory: the shared one's counters move with every other build on the machine."""
    monkeypatch.setenv("CCACHE_DIR", str(tmp_path / "ccache"))     # build._env keeps a CCACHE_DIR it is given
    repo = clone(c2, tmp_path / "repo")
    apply.apply(repo, opts=OPTS)
    f = tmp_path / "repo" / "tools/server/server-context.cpp"
    text = f.read_text()
    anchor = "std::vector<server_slot *> in_play;\n"
    assert text.count(anchor) == 1
    f.write_text(text.replace(anchor, anchor + "        int patchkit_unused_probe = 0;\n"))
    repo.git.commit("-qam", "a stray variable in the patch")

    def hits() -> int:
        out = subprocess.run(["ccache", "--print-stats"], capture_output=True, text=True, env=build._env(tmp_path),
                             check=True).stdout
        return sum(int(v) for k, v in (line.split("\t") for line in out.splitlines()) if k.endswith("_cache_hit"))

    for run, expected_hits in (("compiled", 0), ("replayed", 1)):
        ck = check.check(repo, opts=OPTS)
        assert not ck.errors, (run, ck.errors)
        assert any("patchkit_unused_probe" in w and "unused" in w for w in ck.new_warnings), (run, ck.new_warnings)
        assert hits() == expected_hits, f"{run}: {hits()} ccache hits, expected {expected_hits}"
