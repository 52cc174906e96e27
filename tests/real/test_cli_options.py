"""Every option of every command, through the command a user types (issue 25). Each call works
on cached artifacts (the c2 builds every other test shares), and asserts what the option did,
not only the exit code. tests/fast/test_option_coverage.py fails on an option no test passes."""
import json
import subprocess
import sys

import git

from toolkit import errors, model, source

from .conftest import clone, snapshot


def patchkit(*args, **kw):
    return subprocess.run([sys.executable, "-m", "toolkit", *args], capture_output=True, text=True, **kw)


def test_source_fetch_model_and_build_report_what_they_did(c2, c2_base, tmp_path):
    res = patchkit("source", "fetch", "--package", "llama-cpp-python", "--version", source.DEFAULT_VERSION, "--json")
    got = json.loads(res.stdout)
    assert res.returncode == 0 and got["commit"] == c2.commit and got["fetched"] is False, res.stderr
    assert got["path"] == str(c2.path)
    assert "Popen(['git'" not in res.stderr
    loud = patchkit("-v", "source", "fetch", "--json")  # -v: every external command is logged
    assert loud.returncode == 0 and "Popen(['git', 'rev-parse'" in loud.stderr, loud.stderr[-1000:]

    res = patchkit("model", "--draft", "--out", str(tmp_path / "draft.gguf"))
    assert res.returncode == 0, res.stderr
    draft, tiny = model.ensure(model.DRAFT), model.ensure(model.TINY)
    assert res.stdout.startswith(f"sha256 {draft.sha256}") and draft.sha256 != tiny.sha256
    assert f"{tiny.n_vocab} tokens" in res.stdout, "the draft speaks the target's vocabulary"
    assert (tmp_path / "draft.gguf").read_bytes() == draft.path.read_bytes()

    res = patchkit("build", "--repo", str(c2.path), "--ref", source.BASELINE_TAG, "--json")
    b = json.loads(res.stdout)
    assert res.returncode == 0 and b["reused"] is True and b["binary"] == str(c2_base.binary), res.stderr
    assert b["commit"] == c2.commit and b["compile_commands"].endswith("compile_commands.json")


def test_apply_with_every_option_then_check_and_revert(c2, c2_patched, tmp_path):
    repo = clone(c2, tmp_path / "T")
    T = str(tmp_path / "T")
    before = snapshot(repo)
    dry = patchkit("apply", "--repo", T, "--check", "--json")
    d = json.loads(dry.stdout)
    assert dry.returncode == 0 and d["status"] == "checked" and d["layout"] == "C2" and d["diff"].startswith("--- a/")
    assert snapshot(repo) == before, "--check writes nothing"

    res = patchkit("apply", "--repo", T, "--patch", "evict-largest-slot", "--policy", "smallest", "--branch",
                   "review/smallest", "--json")
    a = json.loads(res.stdout)
    assert res.returncode == 0 and a["status"] == "applied" and a["branch"] == "review/smallest", res.stderr
    assert repo.active_branch.name == "review/smallest" and a["head"] == repo.head.commit.hexsha
    assert "policy=smallest" in repo.head.commit.message

    # check: the patched TU compiles clean, the property harness drives its surgery 500 times
    res = patchkit("check", "--repo", T, "--ref", "review/smallest", "--property", "--iterations", "500", "--json")
    c = json.loads(res.stdout)
    assert res.returncode == 0 and c["ok"] and c["commit"] == a["head"], res.stdout[-2000:] + res.stderr[-2000:]
    assert c["errors"] == [] and c["property"]["ok"] and c["property"]["iterations"] == 500, c["property"]

    # the smallest victim in prompt-victim frees too little: a second overflow in the SAME step (the
    # retry after the first eviction runs out again). Measured with the first victim gone from the
    # batch, the second is again the smallest of those left (measure.py; issue 26's policies)
    res = patchkit("verify", "--repo", T, "--candidate", "review/smallest", "--policy", "smallest", "--workload",
                   "prompt-victim", "--report-dir", str(tmp_path / "v"), "--json")
    v = json.loads(res.stdout)
    assert res.returncode == 0 and v["ok"], v["summary"]
    evs = v["workloads"]["prompt-victim"]["candidate"][0]["overflows"]
    assert len(evs) >= 2 and all(e["terminated"] == e["expected"] for e in evs), evs
    first = set(evs[0]["terminated"])
    assert not first & {s["slot"] for e in evs[1:] for s in e["in_play"]}, "a terminated slot is not in play again"
    res = patchkit("apply", "--repo", T, "--revert", "--branch", "review/smallest", "--json")
    r = json.loads(res.stdout)
    assert res.returncode == 0 and r == {"status": "reverted", "to": "main", "branch_deleted": True}, res.stderr
    assert snapshot(repo) == before


def test_demo_with_its_options(c2, c2_base, c2_patched, tmp_path):
    res = patchkit("demo", "--repeat", "1", "--report-dir", str(tmp_path / "out"), "--model", "tiny", "--json")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rep = json.loads(res.stdout)
    assert rep == json.loads((tmp_path / "out" / "report.json").read_text())
    repo = git.Repo(c2.path)
    assert rep["base_commit"] == c2.commit
    # the default patch, rendered on the base: the tree of the shared patched build (one binary)
    assert repo.commit(rep["candidate_commit"]).tree == repo.commit(c2_patched.commit).tree
    # every shape and every pair is some workload's by design: the demo reaches all of them
    assert "shapes reached 17/17; pairs reached 10/10" in rep["summary"], rep["summary"]
    assert all(w["model"]["name"] == "tiny" for w in rep["workloads"].values())
    assert all(len(w["candidate"]) == 1 for w in rep["workloads"].values())


def test_verify_a_broken_variant_with_upstream_tests_and_a_model(c2, c2_base, tmp_path):
    """--variant renders a deliberately broken eviction (no index remap); the verdict fails for that
    reason. --upstream-tests runs one of llama.cpp's own tests on both sides beside it. --fail-fast
    goes on past a workload that holds (fits: no overflow, nothing for the variant to break) and
    stops after the first that fails: overflow-4 is not run, on either side."""
    res = patchkit("verify", "--repo", str(c2.path), "--base", source.BASELINE_TAG, "--variant", "no-remap",
                   "--workload", "fits", "--workload", "victim-first", "--workload", "overflow-4", "--fail-fast",
                   "--model", "tiny", "--upstream-tests",
                   "unit/test_basic.py::test_server_props", "--report-dir", str(tmp_path), "--json")
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    rep = json.loads(res.stdout)
    assert "variant no-remap" in rep["candidate"]
    assert list(rep["workloads"]) == ["fits", "victim-first"] and rep["workloads"]["fits"]["ok"], rep["summary"]
    assert rep["not_run"] == ["overflow-4"] and rep["outcome"] == "FAIL"
    assert "--fail-fast stopped at the first failed workload: 1 not run (overflow-4)" in rep["summary"]
    assert not list((tmp_path / "logs").glob("overflow-4.*")), "overflow-4 ran on some side"
    fails = {c["name"] for v in rep["workloads"]["victim-first"]["verdicts"] for c in v["checks"]
             if c["status"] == "fail"}
    assert "integrity" in fails, fails
    up = rep["upstream"]
    assert up["counts"]["passed_before"] == up["counts"]["passed_after"] == 1 and up["regressions"] == [], up


def test_repro_of_a_commit_against_a_named_base(c2, tmp_path):
    import base64

    repo = clone(c2, tmp_path / "T")
    (tmp_path / "T" / "NOTE").write_text("a reviewer's note\n")
    repo.git.add("NOTE")
    repo.git.commit("-qm", "a note")
    note = repo.head.commit.hexsha
    repo.git.checkout("-q", "-b", "other", "HEAD~1")
    res = patchkit("repro", "--repo", str(tmp_path / "T"), "--base", source.BASELINE_TAG, "--commit", note,
                   "--repeat", "2", "--workload", "fits", "--patchkit-spec", "git+https://example.org/pk@0123abc",
                   "--out", str(tmp_path / "r.sh"))
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "r.sh").read_text()
    assert "PATCHKIT_SPEC=${PATCHKIT_SPEC:-git+https://example.org/pk@0123abc}" in text
    assert "--repeat 2" in text and "--workload fits" in text and "BASE=patchkit-baseline" in text
    embedded = text.split("printf '%s' ", 1)[1].split(" | base64 -d", 1)[0].strip("'")
    assert "+a reviewer's note" in base64.b64decode(embedded).decode()
    # two candidates at once are refused, naming the options
    res = patchkit("repro", "--repo", str(tmp_path / "T"), "--commit", note, "--patch", "evict-largest-slot",
                   "--out", str(tmp_path / "r2.sh"))
    assert res.returncode == errors.UsageError.exit_code and "at most one of" in res.stderr
    assert not (tmp_path / "r2.sh").exists()
