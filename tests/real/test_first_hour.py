"""A new user's first hour, as the README tells it: fetch, clone, apply, verify the patch branch.
The base is found from the series (printed), and a base equal to the candidate is refused."""
import subprocess
import sys
from pathlib import Path

from toolkit import runner

from .conftest import clone, snapshot


def patchkit(*args):
    return subprocess.run([sys.executable, "-m", "toolkit", *args], capture_output=True, text=True)


def test_newcomer_sequence_apply_then_verify(c2, c2_base, tmp_path):
    fetched = patchkit("source", "fetch")
    assert fetched.returncode == 0 and fetched.stdout.strip().endswith(str(c2.path)), fetched.stderr
    repo = clone(c2, tmp_path / "T")
    base = repo.head.commit.hexsha
    assert patchkit("apply", "--repo", str(tmp_path / "T")).returncode == 0
    assert repo.active_branch.name == "patchkit/evict-largest-slot"
    res = patchkit("verify", "--repo", str(tmp_path / "T"), "--candidate", "patchkit/evict-largest-slot",
                   "--workload", "overflow-4", "--report-dir", str(tmp_path / "out"))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    first = res.stderr.splitlines()[0]
    assert first.startswith(f"base {base[:12]}: the commit patchkit/evict-largest-slot was patched on"), first
    assert res.stdout.strip().endswith("PASS")

    # the trap of the old README: the patched HEAD as base, the same commit as candidate
    before = snapshot(repo)
    same = patchkit("verify", "--repo", str(tmp_path / "T"), "--base", "HEAD", "--candidate",
                    "patchkit/evict-largest-slot", "--workload", "overflow-4", "--report-dir", str(tmp_path / "o2"))
    assert same.returncode == 2, same.stderr
    assert "the base and the candidate are the same commit" in same.stderr
    assert "building" not in same.stderr, "refused before anything is built"
    # and the default patch on an already patched base: refused too
    again = patchkit("verify", "--repo", str(tmp_path / "T"), "--base", "HEAD", "--workload", "overflow-4",
                     "--report-dir", str(tmp_path / "o3"))
    assert again.returncode == 2 and "already carries a patchkit series" in again.stderr, again.stderr
    assert snapshot(repo) == before


def test_plain_verify_judges_head_and_never_judges_a_tree_against_itself(c2, c2_base, tmp_path):
    """Right after apply, plain `verify` judges HEAD (the user's patch branch) against the commit
    under its series. One more commit on the branch (a README note), then plain `verify`: HEAD is
    not itself a series, the default patch on it changes nothing, so base and candidate would be
    one tree (one binary): refused with exit 2, before anything is built, saying how to judge it."""
    import json

    repo = clone(c2, tmp_path / "T")
    base = repo.head.commit.hexsha
    assert patchkit("apply", "--repo", str(tmp_path / "T")).returncode == 0
    head = repo.head.commit.hexsha
    res = patchkit("verify", "--repo", str(tmp_path / "T"), "--workload", "overflow-4", "--report-dir",
                   str(tmp_path / "out"))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert (report["base_commit"], report["candidate_commit"]) == (base, head)
    assert "patched on" in report["base_why"]
    assert report["candidate"].startswith("HEAD (branch patchkit/evict-largest-slot)"), report["candidate"]
    # each candidate run's log as measured (its size, and its most growth while no request received
    # anything, under the cap that cuts a looping server: runner.Flood)
    for r in report["workloads"]["overflow-4"]["candidate"]:
        assert r["log_bytes"] == Path(r["log"]).stat().st_size > 0, r["log"]
        assert 0 <= r["log_quiet_bytes"] < min(r["log_bytes"], runner.QUIET_CAP), r["log_quiet_bytes"]

    (tmp_path / "T" / "README.note").write_text("a note on the patch branch\n")
    repo.git.add("README.note")
    repo.git.commit("-qm", "a note")
    before = snapshot(repo)
    res = patchkit("verify", "--repo", str(tmp_path / "T"), "--workload", "overflow-4", "--report-dir",
                   str(tmp_path / "o2"))
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert "a verdict on nothing" in res.stderr and "already carries a patchkit series" in res.stderr, res.stderr
    assert f"pass --candidate {repo.head.commit.hexsha[:12]}" in res.stderr, res.stderr
    assert "building" not in res.stderr, "refused before anything is built"
    assert not (tmp_path / "o2" / "report.json").exists()
    assert snapshot(repo) == before
