"""Issue 28: the fork's own branches as referee rows. A branch that carries a park patch rendered
under other names (no patchkit trailer, no patchkit identifiers: a foreign-looking candidate) is a
row beside patchkit's strategies, judged by what it measurably does, with its own server
environment."""
import json
import subprocess
import sys

import git

from toolkit import apply, source

from .conftest import clone, commit_on

RENAMES = {"park_one_slot": "preempt_to_host", "resume_parked_slots": "restore_swapped",
           "SLOT_STATE_PREEMPTED": "SLOT_STATE_SWAPPED", "remove_slot_entries": "drop_slot_tokens"}


def test_a_foreign_park_branch_is_a_row_beside_patchkits_strategies(c2, c2_base, tmp_path):
    repo = clone(c2, tmp_path / "T")
    park, an = apply.candidate_commit(git.Repo(c2.path), c2.commit, "park-slot")
    text = git.Repo(c2.path).git.show(f"{park}:{an.file}") + "\n"
    for old, new in RENAMES.items():
        assert old in text
        text = text.replace(old, new)
    sha = commit_on(repo, c2.commit, {an.file: text}, "server: swap a slot out when the KV cache is full")
    repo.git.branch("fork/pr-park", sha)
    repo.git.branch("fork/pr-park-declared", sha)   # the same code (one build), declaring park-slot's promises
    (tmp_path / "promises.toml").write_text('like = "park-slot"\n')
    assert "Patchkit" not in repo.commit(sha).message
    res = subprocess.run([sys.executable, "-m", "toolkit", "referee", "--repo", str(tmp_path / "T"), "--base",
                          source.BASELINE_TAG, "--strategy", "base", "--strategy", "park:largest", "--candidate",
                          "fork/pr-park", "--candidate-env", "fork/pr-park=PREEMPT_KNOB=1",
                          "--candidate-args", "fork/pr-park=--threads 1", "--candidate", "fork/pr-park-declared",
                          "--candidate-promises", f"fork/pr-park-declared={tmp_path / 'promises.toml'}",
                          "--workload", "overflow-4", "--report-dir", str(tmp_path / "ref"), "--json"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    doc = json.loads(res.stdout)
    rows = {r["entry"]: r for r in doc["rows"]}
    # its code is not patchkit's (renamed): no promise found, unless it declares them
    said = doc["promises"]
    assert said["ref fork/pr-park PREEMPT_KNOB=1 --threads 1"] == "none found: judged on the property alone", said
    assert said["ref fork/pr-park-declared"].startswith("preemption, policy largest; a request parked 3 times is "
                                                        "passed over; resume by swap"), said
    assert f"file {tmp_path / 'promises.toml'}" in said["ref fork/pr-park-declared"], said
    assert rows["ref fork/pr-park-declared"]["verdict"] == "PASS", rows["ref fork/pr-park-declared"]
    foreign = rows["ref fork/pr-park PREEMPT_KNOB=1 --threads 1"]
    # measured, not declared: it parks, so the preemption expectations judged it, and it passes
    assert foreign["expect"] == "preemption" and foreign["verdict"] == "PASS", foreign
    assert foreign["completed"] == 4 and foreign["parks"] >= 1 and foreign["exact"] == "4/4", foreign
    # the same code under patchkit's names gives the same outcomes
    ours = rows["park:largest"]
    assert (ours["completed"], ours["parks"], ours["exact"]) == (foreign["completed"], foreign["parks"],
                                                                  foreign["exact"])
    assert rows["base"]["completed"] == 0
    md = (tmp_path / "ref" / "report.md").read_text()
    assert "| ref fork/pr-park PREEMPT_KNOB=1 --threads 1 | 4/4 |" in md
    print(next(line for line in md.splitlines() if line.startswith("| ref fork/pr-park")))
