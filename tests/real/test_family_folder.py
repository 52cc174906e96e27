"""Issue 27: a new patch family is one folder. park-slot copied under another name into a
directory of the fork's own (PATCHKIT_FAMILIES), its patch.toml renamed, and nothing else: every
command takes it (apply, check, build, verify --expect preemption, export, referee), with no
Python file of patchkit changed. The copy renders park-slot's tree, so its binary is the one the
preemption tests share (no build of its own)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import git

from toolkit import apply, patch

from .conftest import clone

ROOT = Path(__file__).resolve().parents[2]


def test_a_family_added_as_a_folder_goes_through_every_command(c2, c2_base, tmp_path):
    toolkit_before = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "toolkit"],
                                    capture_output=True, text=True).stdout
    fams = tmp_path / "fork-families"
    shutil.copytree(ROOT / "patches" / "park-slot", fams / "park-copy")
    meta = fams / "park-copy" / "patch.toml"
    text = meta.read_text()
    assert text.count('name = "park-slot"') == 1 and text.count('strategy = "park"') == 1
    meta.write_text(text.replace('name = "park-slot"', 'name = "park-copy"')
                    .replace('strategy = "park"', 'strategy = "park-copy"'))
    env = dict(os.environ, PATCHKIT_FAMILIES=str(fams))

    def patchkit(*args):
        res = subprocess.run([sys.executable, "-m", "toolkit", *args], capture_output=True, text=True, env=env)
        assert res.returncode == 0, (args, res.stdout[-2000:], res.stderr[-2000:])
        return json.loads(res.stdout) if "--json" in args else res.stdout

    repo = clone(c2, tmp_path / "T")
    T = str(tmp_path / "T")
    a = patchkit("apply", "--repo", T, "--patch", "park-copy", "--json")
    assert a["status"] == "applied" and a["branch"] == "patchkit/park-copy" and a["layout"] == "C2"
    assert "Patchkit-Patch: park-copy policy=largest" in repo.head.commit.message
    # the same templates, the same tree as park-slot's: the shared park binary serves it
    right, _ = apply.candidate_commit(git.Repo(c2.path), c2.commit, "park-slot")
    assert repo.head.commit.tree.hexsha == git.Repo(c2.path).commit(right).tree.hexsha

    c = patchkit("check", "--repo", T, "--json")  # the family read from the series' trailer
    assert c["ok"] and c["errors"] == [], c
    assert {s["name"] for s in c["static"]} >= {"hook-called", "removes-entries", "indices-remapped"}
    b = patchkit("build", "--repo", T, "--json")
    assert Path(b["binary"]).exists() and b["commit"] == a["head"]

    v = patchkit("verify", "--repo", T, "--expect", "preemption", "--workload", "overflow-4", "--workload",
                 "prompt-survivor", "--report-dir", str(tmp_path / "v"), "--json")
    assert v["ok"] and v["expect"] == "preemption" and v["candidate_commit"] == a["head"], v["summary"]
    assert "shapes reached 4/5" in v["summary"] or "shapes reached 5/5" in v["summary"], v["summary"]

    e = patchkit("export", "--repo", T, "--patch", "park-copy", "--out", str(tmp_path / "pr"), "--json")
    assert e["ok"] and len(e["patches"]) == 2, e   # the change, then its own test
    assert e["own_test"]["base"] == "failed" and e["own_test"]["candidate"] == "passed", e["own_test"]
    pr = Path(e["description"]).read_text()
    assert "server: on KV-cache exhaustion park one slot instead of failing all" in pr

    r = patchkit("referee", "--repo", T, "--base", a["base"], "--strategy", "base", "--strategy",
                 "park-copy:largest", "--workload", "overflow-4", "--traffic", "lmstudio-1757",
                 "--report-dir", str(tmp_path / "ref"), "--json")
    rows = {row["entry"]: row for row in r["rows"]}
    assert rows["park-copy:largest"]["verdict"] == "PASS" and rows["park-copy:largest"]["completed"] == 4, rows
    assert rows["base"]["completed"] == 0
    # the users' traffic on the same rows: the base measured (it ends every chat in play at each
    # overflow), the new family judged by its promise (a preemption ends no turn) and exact
    tt, = r["traffic"]
    assert tt["workload"] == "lmstudio-1757", tt
    trows = {row["entry"]: row for row in tt["rows"]}
    assert list(trows) == ["base", "park-copy:largest"], trows
    assert trows["base"]["outcome"] == "-" and trows["base"]["summary"]["failed_attempts"] > 0, trows["base"]
    park = trows["park-copy:largest"]
    assert park["outcome"] == "PASS" and park["summary"]["turns_exact"] == 1, park
    assert park["summary"]["turns_completed"] == park["summary"]["turns_planned"] == 12, park
    assert park["summary"]["failed_attempts"] == 0, park
    assert "## traffic lmstudio-1757" in (tmp_path / "ref" / "report.md").read_text()

    # without the directory the family does not exist: refused, naming where it looked
    gone = subprocess.run([sys.executable, "-m", "toolkit", "apply", "--repo", T, "--patch", "park-copy", "--check"],
                          capture_output=True, text=True)
    assert gone.returncode == 2 and "no patch named 'park-copy'" in gone.stderr
    assert "park-copy" not in patch.families()
    toolkit_after = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "toolkit"],
                                   capture_output=True, text=True).stdout
    assert toolkit_after == toolkit_before, "no Python file of patchkit changed"
