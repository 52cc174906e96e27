"""A new user's first hour, as the README tells it: fetch, clone, apply, verify the patch branch.
The base is found from the series (printed), and a base equal to the candidate is refused."""
import subprocess
import sys

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
