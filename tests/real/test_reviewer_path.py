"""Issue 25, the reviewer's path as a reviewer walks it: `patchkit repro` writes a script, the
script runs in a fresh HOME and a fresh venv that pip-installs this checkout (PATCHKIT_SPEC),
and its exit code and verdict are asserted, for each kind of candidate a reviewer brings.

PATCHKIT_CACHE stays the test session's: the fresh HOME proves the script needs nothing of the
user's home (git identity, pip config, patchkit cache location), while the shared cache keeps
one build per tree content (a fresh cache would add a cold build, ~10 min, per script)."""
import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import git

from toolkit import cache, errors

from .conftest import clone, snapshot

ROOT = Path(__file__).resolve().parents[2]


def patchkit(*args, **kw):
    return subprocess.run([sys.executable, "-m", "toolkit", *args], capture_output=True, text=True, **kw)


def run_script(script: Path, tmp_path: Path, name: str) -> subprocess.CompletedProcess:
    home = tmp_path / f"home-{name}"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "VIRTUAL_ENV"))}
    env.update(HOME=str(home), WORK=str(tmp_path / f"work-{name}"), PATCHKIT_SPEC=str(ROOT),
               PATCHKIT_CACHE=str(cache.root()), PATCHKIT_VENV_FLAGS="--system-site-packages")
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=1800)


def llama_servers() -> set[int]:
    """This session's servers only (the repro script's env keeps the session marker): another
    patchkit run on the machine, a referee beside the tests, is not ours to count."""
    from tests.conftest import _llama_servers
    return _llama_servers()


def own_change(c2, c2_patched, tmp_path) -> tuple[git.Repo, str]:
    """A reviewer's clone with branch `my-fix`: the eviction's diff committed by hand, as a user
    would commit their own change (no patchkit trailer: not a patchkit series)."""
    repo = clone(c2, tmp_path / "T")
    diff = git.Repo(c2.path).git.diff(c2.commit, c2_patched.commit) + "\n"
    (tmp_path / "fix.diff").write_text(diff)
    repo.git.checkout("-q", "-b", "my-fix")
    repo.git.apply(str(tmp_path / "fix.diff"))
    repo.git.commit("-qam", "server: terminate one slot on a full unified KV cache")
    repo.git.checkout("-q", "main")
    assert "Patchkit" not in repo.commit("my-fix").message
    return repo, diff


def test_repro_of_a_change_of_your_own_passes_in_a_fresh_home(c2, c2_patched, tmp_path):
    repo, diff = own_change(c2, c2_patched, tmp_path)
    before = snapshot(repo)
    script = tmp_path / "repro.sh"
    res = patchkit("repro", "--repo", str(tmp_path / "T"), "--candidate", "my-fix", "--workload", "overflow-4",
                   "--out", str(script))
    assert res.returncode == 0, res.stderr
    text = script.read_text()
    embedded = text.split("printf '%s' ", 1)[1].split(" | base64 -d", 1)[0].strip("'")
    assert base64.b64decode(embedded).decode().strip() == diff.strip(), "the script carries the exact change"
    assert snapshot(repo) == before, "writing a script touches nothing of the reviewer's checkout"
    run = run_script(script, tmp_path, "own")
    out, err = run.stdout, run.stderr
    assert run.returncode == 0, out[-3000:] + err[-3000:]
    assert "candidate" in err and "patch file candidate.patch" in err, err[-3000:]
    # patchkit's eviction committed by hand: recognised by its code, held to the series' promises
    assert ("promises: eviction, policy largest; one log line per eviction; /metrics counts them "
            "(evict-largest-slot, code: "
            "evict-largest-slot's definitions") in err, err[-3000:]
    assert "expectations: eviction (auto: the candidate is patch file candidate.patch)" in err, err[-3000:]
    assert "overflow-4: ok" in out and out.strip().endswith("PASS"), out[-3000:]
    assert not llama_servers()


def test_verify_takes_a_diff_a_commit_and_a_named_patch_on_c2(c2, c2_patched, tmp_path):
    """The same change as --patch-file (the bug of issue 25: "no patch named 'file'"), as
    --commit (merged into the base, as a nightly merges a pin), and patchkit's own --patch."""
    repo, _ = own_change(c2, c2_patched, tmp_path)
    before = snapshot(repo)
    T = str(tmp_path / "T")
    for args in (["--patch-file", str(tmp_path / "fix.diff")], ["--commit", "my-fix"],
                 ["--patch", "evict-largest-slot", "--policy", "largest", "--expect", "eviction"]):
        out = tmp_path / f"out-{args[0][2:]}"
        res = patchkit("verify", "--repo", T, *args, "--workload", "overflow-4", "--report-dir", str(out), "--json")
        assert res.returncode == 0, (args, res.stdout[-2000:], res.stderr[-2000:])
        rep = json.loads(res.stdout)
        assert rep["ok"] and rep["expect"] == "eviction", (args, rep["expect"], rep["expect_why"])
        want = {"--patch-file": "patch file fix.diff", "--commit": "merged into base",
                "--patch": "patch evict-largest-slot"}[args[0]]
        assert want in rep["candidate"], rep["candidate"]
        # patchkit's eviction committed by hand is recognised by its code (issue 34): its policy is its
        # promise whichever way it came; what it did is still measured beside it
        assert rep["policy"] == "largest"
        if args[0] != "--patch":
            assert "code: evict-largest-slot's definitions" in rep["promises"], rep["promises"]
        # the candidate is the same tree each time: one binary, never a rebuild
        assert git.Repo(T).commit(rep["candidate_commit"]).tree.hexsha == git.Repo(c2.path).commit(
            c2_patched.commit).tree.hexsha
    assert snapshot(repo) == before
    assert not llama_servers()


def test_repro_of_a_patchkit_patch_passes_in_a_fresh_home(c2, c2_patched, tmp_path):
    """With --traffic the script also serves the users' chat traffic (LM Studio #1757) to base and
    candidate: the reviewer sees the base end several users' turns at one overflow and the
    candidate one."""
    script = tmp_path / "repro.sh"
    res = patchkit("repro", "--patch", "evict-largest-slot", "--workload", "overflow-4", "--repeat", "1",
                   "--traffic", "lmstudio-1757", "--out", str(script))
    assert res.returncode == 0, res.stderr
    assert "CANDIDATE=(--patch evict-largest-slot)" in script.read_text()
    run = run_script(script, tmp_path, "patch")
    out = run.stdout
    assert run.returncode == 0, out[-3000:] + run.stderr[-3000:]
    assert "overflow-4: ok" in out and out.strip().endswith("PASS")
    # the traffic ran after the lab table, on both sides, judged turn by turn; its report is kept
    lab, users = out.split("traffic lmstudio-1757:", 1)
    assert lab.strip().endswith("PASS"), "verify's verdict comes first"
    doc = json.loads((tmp_path / "work-patch" / "report" / "traffic-1" / "traffic.json").read_text())
    w = next(w for w in doc["workloads"] if w["traffic"] == "lmstudio-1757")
    base, cand = w["sides"]["base"][0], w["sides"]["candidate"][0]
    assert any(n > 1 for n in base["overflows"]) and set(cand["overflows"]) == {1}, (base["overflows"],
                                                                                   cand["overflows"])
    assert "candidate:" in users and "-> PASS" in users
    # a traffic workload that does not exist is refused when the script is written, not on the
    # reviewer's machine
    res = patchkit("repro", "--traffic", "no-such-traffic", "--out", str(tmp_path / "bad.sh"))
    assert res.returncode == errors.UsageError.exit_code and "no-such-traffic" in res.stderr, res.stderr
    assert not (tmp_path / "bad.sh").exists()
    row3 = next(line for line in out.splitlines() if line.strip().startswith("3 ") and "100" in line)
    assert "errored" in row3 and "Context size has been exceeded." in row3
    for slot in "012":
        row = next(line for line in out.splitlines() if line.strip().startswith(f"{slot} "))
        assert "completed 240/240" in row


def test_repro_of_a_diff_that_does_not_apply_fails_clearly_and_leaves_nothing(c2, tmp_path):
    bad = tmp_path / "stale.diff"
    bad.write_text("--- a/tools/server/server-context.cpp\n+++ b/tools/server/server-context.cpp\n"
                   "@@ -1,3 +1,3 @@\n-this line is not in the file\n+nor is this one\n context\n context\n")
    cached = git.Repo(c2.path)
    before = snapshot(cached)
    script = tmp_path / "repro.sh"
    res = patchkit("repro", "--patch-file", str(bad), "--workload", "overflow-4", "--out", str(script))
    assert res.returncode == 0, res.stderr
    run = run_script(script, tmp_path, "stale")
    assert run.returncode == errors.PatchError.exit_code, (run.returncode, run.stderr[-2000:])
    assert "candidate.patch does not apply to" in run.stderr and "patch failed" in run.stderr, run.stderr[-2000:]
    assert "building" not in run.stderr, "refused before anything is built"
    assert snapshot(cached) == before, "the fetched tree's branches, index and files are untouched"
    assert not llama_servers()
