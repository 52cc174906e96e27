"""Issue 18: the series a maintainer takes. `export` writes format-patch files and a PR description
of figures measured in the run; `git am` of the export onto a fresh tree of C2 and D applies, and
the result builds and passes; the patched server carries no tool name."""
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import git
import pytest

from toolkit import apply, patch, source, verify, workload
from toolkit.ui import UI

from .conftest import clone


def patchkit(*args):
    return subprocess.run([sys.executable, "-m", "toolkit", *args], capture_output=True, text=True)


@pytest.mark.parametrize("version", ["0.3.35", "0.3.36"], ids=["C2", "D"])
def test_export_then_git_am_on_a_fresh_tree_builds_and_passes(trees, tmp_path, version):
    tree = trees(version)
    repo = git.Repo(tree.path)
    base = source.resolve(repo, source.BASELINE_TAG)
    cand, an = apply.candidate_commit(repo, base)
    text = repo.git.show(f"{cand}:{an.file}")
    assert text.lower().count("patchkit") == 0          # no tool names in the C++
    assert "TODO: try to terminate only the largest" not in text  # upstream's TODO, resolved

    # through the command a user types; --mutants: a campaign's file on this base (its score goes
    # in as given), and one on another base is refused before anything runs
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"base": "0" * 40, "score": {"killed": 1, "judged": 1}, "mutants": []}))
    bad = patchkit("export", "--repo", str(tree.path), "--base", base, "--candidate", cand, "--out",
                   str(tmp_path / "bad"), "--mutants", str(other))
    assert bad.returncode == 2 and "is a campaign on 000000000000, not on this base" in bad.stderr, bad.stderr
    mine = tmp_path / "mutants.json"
    mine.write_text(json.dumps({"base": base, "score": {"killed": 12, "judged": 13}, "mutants": []}))
    out = patchkit("export", "--repo", str(tree.path), "--base", base, "--candidate", cand, "--out",
                   str(tmp_path / "pr"), "--repeat", "1", "--mutants", str(mine), "--json")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    doc = json.loads(out.stdout)
    res = SimpleNamespace(ok=doc["ok"], patches=[Path(p) for p in doc["patches"]], description=Path(doc["description"]))
    assert res.ok and len(res.patches) == 2, "the change, then its own upstream-style test"
    # the series' own test (issue 36): it fails on the base, for the reason it exists, and passes
    own = doc["own_test"]
    assert own["path"] == "tools/server/tests/unit/test_kv_full.py" and own["ok"], own
    assert own["base"] == "failed" and "assert [0, 1, 2, 3] == [3]" in own["base_message"], own
    assert own["candidate"] == "passed", own
    test_patch = res.patches[1].read_text()
    assert "+from utils import *" in test_patch and "+server = ServerPreset.tinyllama2()" in test_patch
    body = res.patches[0].read_text()
    assert body.startswith("From ") and "Subject: [PATCH 1/2] server: on KV-cache exhaustion terminate one slot" in body
    assert "Patchkit-" not in body, "patchkit's bookkeeping trailers are not the maintainer's"
    pr = res.description.read_text()
    # every figure is one measured in this run, with the command that reproduces it
    assert "### Before / after: the default suite (1 run per side): PASS" in pr
    assert re.search(r"driven over 20000 random batches: passed \(ok 20000 batches \(\d+ in embd mode\)", pr), pr
    assert "12 of 13 wrong variants of this patch were caught" in pr
    assert "Not measured in this run (pass `--sanitize`" in pr
    for name in verify.SUITE:
        assert re.search(rf"^{re.escape(name)}: ok", pr, re.M), name
    assert pr.count("Reproduce: `patchkit ") == 5  # suite, families, own test, property harness, mutation score
    assert "### The series' own test: PASS" in pr and "on the base failed" in pr
    assert f", layout {an.facts.layout}," in pr

    fresh = clone(tree, tmp_path / "fresh")
    subprocess.run(["git", "-C", str(tmp_path / "fresh"), "am", "-q", *map(str, res.patches)], check=True)
    applied = fresh.head.commit
    assert applied.tree.hexsha == repo.commit(doc["tip"]).tree.hexsha, "the export is the series, byte for byte"
    assert applied.parents[0].tree.hexsha == repo.commit(cand).tree.hexsha
    assert patch.state((tmp_path / "fresh" / an.file).read_text(), patch.load_patch()) == "applied"
    r = verify.verify(fresh, base_ref=base, candidate_ref="HEAD",
                      workloads=[workload.load(w) for w in ("victim-first", "two-overflows")],
                      out_dir=tmp_path / "v", ui=UI(quiet=True))
    assert r.ok, [(v.workload, c.name, c.detail) for w in r.results for v in w.verdicts for c in v.checks
                  if c.status == "fail"]
