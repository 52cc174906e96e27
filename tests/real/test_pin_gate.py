"""Issue 5 for real: the workflow lints clean, the gate runs end to end, the repro script runs."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from toolkit import apply

from .conftest import clone

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "fixtures" / "pr-set.sample.json"


def patchkit(*args, **kw):
    return subprocess.run([sys.executable, "-m", "toolkit", *args], capture_output=True, text=True, **kw)


def test_workflow_is_actionlint_clean(tmp_path):
    exe = shutil.which("actionlint")
    assert exe, "actionlint is missing: `pip install -e '.[test]'` installs it"
    for wf in ("pin-gate.yml", "mutants.yml"):  # the gate, and the operator campaign's shards and merge
        res = subprocess.run([exe, str(ROOT / "ci" / wf)], capture_output=True, text=True)
        assert res.returncode == 0, wf + res.stdout + res.stderr
    # and it can fail: a broken copy is flagged
    bad = ROOT / "ci" / "pin-gate.yml"
    broken = bad.read_text().replace("runs-on: ubuntu-latest", "runs-on: [")
    tmp = tmp_path / "broken-pin-gate.yml"   # pytest's, removed after a pass: nothing left in /tmp
    tmp.write_text(broken)
    assert subprocess.run([exe, str(tmp)], capture_output=True).returncode != 0


def test_workflow_installs_only_a_pinned_or_vendored_patchkit(tmp_path):
    """The plan job's install step, run as bash: the bare PyPI name (another project's) and an
    unpinned URL are refused before pip runs; a vendored copy or a git URL at a commit installs."""
    import yaml
    wf = yaml.safe_load((ROOT / "ci" / "pin-gate.yml").read_text())
    assert wf["env"]["PATCHKIT_SPEC"] == "${{ vars.PATCHKIT_SPEC || './.github/patchkit' }}"
    step = next(s for s in wf["jobs"]["plan"]["steps"] if s.get("name") == "Install patchkit")
    script = step["run"].replace('python -m pip install "$PATCHKIT_SPEC"', 'echo "INSTALL $PATCHKIT_SPEC"')

    def install(spec):
        return subprocess.run(["bash", "-ec", script], cwd=tmp_path, capture_output=True, text=True,
                              env=dict(os.environ, PATCHKIT_SPEC=spec))
    for spec, why in [("patchkit", "another project's"), ("git+https://github.com/o/patchkit", "another project's"),
                      ("./.github/patchkit", "no patchkit at ./.github/patchkit")]:
        r = install(spec)
        assert r.returncode == 1 and why in r.stdout and "INSTALL" not in r.stdout, (spec, r.stdout)
    (tmp_path / ".github" / "patchkit").mkdir(parents=True)
    (tmp_path / ".github" / "patchkit" / "pyproject.toml").write_text("")
    for spec in ("./.github/patchkit", "git+https://github.com/o/patchkit@" + "a" * 40):
        r = install(spec)
        assert r.returncode == 0 and f"INSTALL {spec}" in r.stdout, (spec, r.stdout + r.stderr)


def _pin_setup(c2, tmp_path, variant=None):
    repo = clone(c2, tmp_path / "llama.cpp")
    if variant:
        sha, _ = apply.candidate_commit(repo, c2.commit, variant=variant)
    else:
        sha = apply.apply(repo).head_commit
        repo.git.checkout("-q", "main")
    url = f"https://github.com/ggml-org/llama.cpp/pull/99999/commits/{sha}"
    # the fork's file before the change: no pins yet; after: this one
    old = tmp_path / "old-pr-set.json"
    old.write_text(SAMPLE.read_text().replace(SAMPLE_PINS, ""))
    new = tmp_path / "pr-set.json"
    new.write_text(SAMPLE.read_text().replace(SAMPLE_PINS, f'\n    "{url}"\n  '))
    return repo, sha, url, old, new


SAMPLE_PINS = SAMPLE.read_text()[SAMPLE.read_text().index('"prs": [') + 8:SAMPLE.read_text().rindex("]")]


def test_gate_then_pin_end_to_end(c2, c2_base, tmp_path):
    repo, sha, url, old, new = _pin_setup(c2, tmp_path)
    summary = tmp_path / "summary.md"
    # the PR as GitHub reports it: open, the pinned commit its head
    states = tmp_path / "states.json"
    states.write_text(json.dumps({"ggml-org/llama.cpp#99999": {"state": "open", "head": sha, "commits": [sha]}}))
    res = patchkit("ci", "--repo", str(tmp_path / "llama.cpp"), "--base", "main", "--pr-set", str(new),
                   "--old-pr-set", str(old), "--report-dir", str(tmp_path / "reports"), "--summary", str(summary),
                   "--workload", "overflow-4", "--workload", "victim-middle", "--pr-state", str(states),
                   "--expect", "eviction", "--repeat", "1", "--owner", "myfork")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.strip().endswith("PASS")
    md = summary.read_text()
    assert "## patchkit pin gate: PASS" in md and "ggml-org/llama.cpp#99999" in md
    assert "| workload | run | slot | prompt | before | after | error |" in md
    report = tmp_path / "reports" / "report.json"
    data = json.loads(report.read_text())
    assert data["ok"] and data["candidate_source_commit"] == sha and data["expect"] == "eviction"
    # the passing report lets the pin land, in the fork's file
    fork = tmp_path / "fork-pr-set.json"
    fork.write_bytes(SAMPLE.read_bytes())
    dry = patchkit("pin", "--pr-set", str(fork), "--url", url, "--report", str(report), "--dry-run", "--optional",
                   "--owner", "myfork", "--json")
    assert dry.returncode == 0 and json.loads(dry.stdout) == {"action": "added", "url": url, "replaced": None,
                                                              "written": False}, dry.stdout + dry.stderr
    assert fork.read_bytes() == SAMPLE.read_bytes(), "--dry-run writes nothing"
    res = patchkit("pin", "--pr-set", str(fork), "--url", url, "--report", str(report))
    assert res.returncode == 0, res.stderr
    assert json.loads(fork.read_text())["prs"][-1] == url
    assert assert_only_tail_changed(SAMPLE.read_text(), fork.read_text())


def assert_only_tail_changed(old: str, new: str) -> bool:
    cut = old.rindex('"', 0, old.rindex("]")) + 1
    return new.startswith(old[:cut]) and new.endswith(old[cut:])


def test_gate_fails_a_broken_pin(c2, c2_base, tmp_path):
    """workflow_dispatch: one URL appended to the fork's (empty) pr-set."""
    repo, sha, url, old, new = _pin_setup(c2, tmp_path, variant="no-remap")
    res = patchkit("ci", "--repo", str(tmp_path / "llama.cpp"), "--base", "main", "--url", url,
                   "--old-pr-set", str(old), "--report-dir", str(tmp_path / "reports"),
                   "--summary", str(tmp_path / "s.md"), "--workload", "victim-first")
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    gate = json.loads((tmp_path / "reports" / "gate.json").read_text())
    assert [c["url"] for c in gate["culprits"]] == [url]
    report = tmp_path / "reports" / "report.json"
    # failed for the right reason: the integrity oracle, survivors differing from the control (and,
    # as consequences, from the before side's streams; a slot whose stale row went unsampled);
    # not a crash, not the victim's choice
    fails = {(v["side"], c["name"]): c["detail"] for v in json.loads(report.read_text())["workloads"]["victim-first"][
        "verdicts"] for c in v["checks"] if c["status"] == "fail"}
    assert ("candidate", "integrity") in fails and set(fails) <= {
        ("candidate", "integrity"), ("candidate", "no-regression"), ("candidate", "one-sample-per-entry")}, fails
    assert "differs from control at token" in fails["candidate", "integrity"]
    fork = tmp_path / "fork.json"
    fork.write_bytes(SAMPLE.read_bytes())
    res = patchkit("pin", "--pr-set", str(fork), "--url", url, "--report", str(report))
    assert res.returncode == 9 and "failing" in res.stderr
    assert fork.read_bytes() == SAMPLE.read_bytes()
