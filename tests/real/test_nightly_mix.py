"""The fork's nightly mix, for real (git only, no builds): our object-store merges equal what
`git merge --no-ff` + the nightly's add/add resolver produce in a checkout; order matters; a
real conflict stops with the nightly's message naming the pin and the pins before it;
`required: false` entries of closed PRs are skipped; a closed required one is still merged."""
import json
import subprocess
import sys

import git
import pytest

from toolkit import mix
from toolkit.errors import UsageError

from .conftest import commit_on

BASE_TEXT = "".join(f"line {i}\n" for i in range(1, 21))


def sh(repo_dir, *args, check=True):
    return subprocess.run(["git", "-C", str(repo_dir), *args], capture_output=True, text=True, check=check)


def insert_after(text: str, n: int, new: str) -> str:
    lines = text.splitlines(keepends=True)
    return "".join(lines[:n] + [new] + lines[n:])


@pytest.fixture
def fork(tmp_path):
    d = tmp_path / "llama.cpp"
    repo = git.Repo.init(d, initial_branch="master")
    (d / "server.cpp").write_text(BASE_TEXT)
    (d / "README.md").write_text("readme\n")
    repo.index.add(["server.cpp", "README.md"])
    repo.index.commit("base")
    base = repo.head.commit.hexsha
    pins = {
        "add-a": commit_on(repo, base, {"server.cpp": insert_after(BASE_TEXT, 10, "added by A\n")}, "A"),
        "add-b": commit_on(repo, base, {"server.cpp": insert_after(BASE_TEXT, 10, "added by B\n")}, "B"),
        "edit-5": commit_on(repo, base, {"server.cpp": BASE_TEXT.replace("line 5\n", "line five\n")}, "C"),
        "edit-5-too": commit_on(repo, base, {"server.cpp": BASE_TEXT.replace("line 5\n", "line FIVE\n")}, "D"),
        "docs": commit_on(repo, base, {"docs.md": "docs\n"}, "E"),
    }
    return repo, base, pins


def entry(name, sha, pr, required=True):
    return mix.Entry(mix.parse_url(f"https://github.com/ggml-org/llama.cpp/pull/{pr}/commits/{sha}"), required)


def nightly_in_a_checkout(repo_dir, tmp_path, base, shas) -> str:
    """What the fork's workflow does, literally: a clone, `git merge --no-ff` per pin with diff3,
    conflicts handed to the add/add-only resolver (union of both sides), then commit."""
    work = tmp_path / "nightly"
    subprocess.run(["git", "clone", "-q", str(repo_dir), str(work)], check=True)
    sh(work, "checkout", "-q", base)
    for sha in shas:
        r = sh(work, "-c", "merge.conflictStyle=diff3", "-c", "user.name=n", "-c", "user.email=n@x",
               "merge", "--no-ff", "-m", f"Merge {sha}", sha, check=False)
        if r.returncode:
            for f in sh(work, "diff", "--name-only", "--diff-filter=U").stdout.split():
                text = (work / f).read_text()
                out, part = [], None
                for ln in text.splitlines(keepends=True):
                    if ln.startswith("<<<<<<< "):
                        part = "ours"
                    elif ln.startswith("||||||| "):
                        part = "base"
                    elif ln.startswith("=======") and part:
                        part = "theirs"
                    elif ln.startswith(">>>>>>> "):
                        part = None
                    elif part != "base":
                        out.append(ln)
                (work / f).write_text("".join(out))
                sh(work, "add", f)
            sh(work, "-c", "user.name=n", "-c", "user.email=n@x", "commit", "-q", "--no-edit")
    return sh(work, "rev-parse", "HEAD^{tree}").stdout.strip()


def test_mix_equals_the_nightlys_merges_and_order_matters(fork, tmp_path):
    repo, base, pins = fork
    ab = mix.build_mix(repo, base, [entry("a", pins["add-a"], 1), entry("b", pins["add-b"], 2),
                                    entry("d", pins["docs"], 3)])
    ba = mix.build_mix(repo, base, [entry("b", pins["add-b"], 2), entry("a", pins["add-a"], 1),
                                    entry("d", pins["docs"], 3)])
    assert ab.ok and ba.ok
    for m, order in ((ab, ["add-a", "add-b", "docs"]), (ba, ["add-b", "add-a", "docs"])):
        assert repo.commit(m.commit).tree.hexsha == nightly_in_a_checkout(
            repo.working_tree_dir, tmp_path / "-".join(order), base, [pins[o] for o in order])
        # one --no-ff merge commit per pin, named as the nightly names it, parents (mix so far, pin)
        c = repo.commit(m.commit)
        assert c.message.startswith("Merge ggml-org/llama.cpp#3 @ " + pins["docs"])
        assert [p.hexsha for p in c.parents][1] == pins["docs"] and len(c.parents) == 2
    text = lambda m: repo.git.show(f"{m.commit}:server.cpp")
    assert text(ab).index("added by A") < text(ab).index("added by B")
    assert text(ba).index("added by B") < text(ba).index("added by A")   # reordering changes the mix
    # the add/add resolution is a warning on the pin that met the conflict
    assert "add/add conflicts in server.cpp" in ab.warnings[0] and ab.warnings[0].startswith("ggml-org/llama.cpp#2")
    # deterministic: the same pr-set on the same base gives the same commits (a CI cache key)
    assert mix.build_mix(repo, base, [entry("a", pins["add-a"], 1), entry("b", pins["add-b"], 2),
                                      entry("d", pins["docs"], 3)]).commit == ab.commit


def test_a_real_conflict_stops_with_the_nightlys_message(fork):
    repo, base, pins = fork
    before = repo.git.for_each_ref()
    m = mix.build_mix(repo, base, [entry("a", pins["add-a"], 1), entry("c", pins["edit-5"], 7),
                                   entry("d", pins["edit-5-too"], 8), entry("x", pins["docs"], 9)])
    assert not m.ok and m.failed_entry.pin.pr == 8
    assert m.failure.startswith(f"ggml-org/llama.cpp#8 ({pins['edit-5-too']}) does not merge cleanly onto BASE + "
                                "the PRs listed before it; reorder or drop it.")
    assert "PRs before it: ggml-org/llama.cpp#1, ggml-org/llama.cpp#7" in m.failure and "server.cpp" in m.failure
    assert repo.git.for_each_ref() == before and not repo.is_dirty(untracked_files=True)   # nothing touched
    # dropping the other editor lets it merge
    assert mix.build_mix(repo, base, [entry("a", pins["add-a"], 1), entry("d", pins["edit-5-too"], 8)]).ok


def test_closed_prs_follow_the_forks_rule(fork, tmp_path):
    repo, base, pins = fork
    states = tmp_path / "states.json"
    states.write_text(json.dumps({"ggml-org/llama.cpp#7": {"state": "closed"},
                                  "ggml-org/llama.cpp#9": {"state": "merged", "head": pins["docs"]},
                                  "ggml-org/llama.cpp#1": {"state": "open", "head": pins["add-b"]}}))
    st = mix.load_states(states)
    # #7 (required: false, closed) would conflict with #8: skipped, so the mix merges
    m = mix.build_mix(repo, base, [entry("a", pins["add-a"], 1), entry("c", pins["edit-5"], 7, required=False),
                                   entry("d", pins["edit-5-too"], 8), entry("x", pins["docs"], 9)], st)
    assert m.ok, m.failure
    assert [s.action for s in m.steps] == ["merged", "skipped", "merged", "merged"]
    w = "\n".join(m.warnings)
    assert "#7" in w and "skipped: the PR is closed and the entry is required: false" in w
    assert "#9" in w and "the PR is merged but the entry is required: it is still merged" in w
    assert "#1" in w and "head moved" in w          # a moved head is only a note
    # a pinned commit that is not one of the PR's commits is refused
    states.write_text(json.dumps({"ggml-org/llama.cpp#1": {"state": "open", "commits": [pins["add-b"]]}}))
    with pytest.raises(UsageError, match="not one of the PR's commits"):
        mix.build_mix(repo, base, [entry("a", pins["add-a"], 1)], mix.load_states(states))


def test_untrusted_pr_set_is_validated_before_anything():
    bad = json.dumps({"prs": ["https://github.com/ggml-org/llama.cpp/pull/1/commits/" + "a" * 40,
                              "https://github.com/evil/llama.cpp/pull/2/commits/" + "b" * 40]})
    with pytest.raises(UsageError, match="owner 'evil' is not allowed"):
        mix.parse(bad)
    with pytest.raises(UsageError, match='"required": "no"'):
        mix.parse(json.dumps({"prs": [{"url": "https://github.com/ggml-org/llama.cpp/pull/1/commits/" + "a" * 40,
                                       "required": "no"}]}))


def test_ci_reports_a_mix_that_does_not_merge(fork, tmp_path):
    """`patchkit ci`: the new file's pins conflict -> exit 1 with the nightly's message and the pin
    named, before anything is built; the user's checkout is untouched."""
    repo, base, pins = fork
    status = repo.git.status("--porcelain"), repo.head.commit.hexsha
    u = lambda pr, k: f"https://github.com/ggml-org/llama.cpp/pull/{pr}/commits/{pins[k]}"
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps({"prs": [u(7, "edit-5")]}))
    new.write_text(json.dumps({"prs": [u(7, "edit-5"), u(8, "edit-5-too")]}))
    res = subprocess.run([sys.executable, "-m", "toolkit", "ci", "--repo", repo.working_tree_dir, "--base", base,
                          "--old-pr-set", str(old), "--pr-set", str(new), "--report-dir", str(tmp_path / "g"),
                          "--summary", str(tmp_path / "s.md")], capture_output=True, text=True)
    assert res.returncode == 1, res.stdout + res.stderr
    md = (tmp_path / "s.md").read_text()
    assert "the nightly would stop**: ggml-org/llama.cpp#8 (" in md and "reorder or drop it" in md
    assert "responsible pin**: ggml-org/llama.cpp#8" in md
    assert not json.loads((tmp_path / "g" / "gate.json").read_text())["workloads"]     # nothing was built or run
    assert (repo.git.status("--porcelain"), repo.head.commit.hexsha) == status
    # reordered, the other one is named: each merges onto the base plus the pins before it
    new.write_text(json.dumps({"prs": [u(8, "edit-5-too"), u(7, "edit-5")]}))
    res = subprocess.run([sys.executable, "-m", "toolkit", "ci", "--repo", repo.working_tree_dir, "--base", base,
                          "--old-pr-set", str(old), "--pr-set", str(new), "--report-dir", str(tmp_path / "g2"),
                          "--json"], capture_output=True, text=True)
    assert res.returncode == 1 and json.loads(res.stdout)["culprits"][0]["pin"] == "ggml-org/llama.cpp#7"
