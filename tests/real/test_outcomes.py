"""Three outcomes (issue 34), through the command a user types: a tie is a set of right victims
(PASS), and a workload whose designed shape cannot be reached is INCONCLUSIVE with its own exit
code, never FAIL."""
import json
import os
import subprocess
import sys
from pathlib import Path

from toolkit import errors

ROOT = Path(__file__).resolve().parents[2]


def patchkit(*args, env=None):
    return subprocess.run([sys.executable, "-m", "toolkit", *args], capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})))


def test_four_equal_requests_pass_and_a_shape_that_cannot_be_reached_is_inconclusive(c2_patched, tmp_path):
    tie = ROOT / "fixtures" / "workloads" / "tie-4.toml"
    res = patchkit("verify", "--workload", str(tie), "--report-dir", str(tmp_path / "tie"))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    rep = json.loads((tmp_path / "tie" / "report.json").read_text())
    victim = [c for v in rep["workloads"]["tie-4"]["verdicts"] for c in v["checks"] if c["name"] == "victim-is-largest"]
    # four equal prompts: tied at the overflow ("any of them is right"), or, when one slot got a
    # step ahead, a unique largest; either way the patch's victim is right
    assert victim and all(c["status"] == "pass" for c in victim), victim
    # the same requests, declared to exercise the index shift: with four tied slots the policy's
    # victim is not unique, so the shape cannot be reached; one start (PATCHKIT_ATTEMPTS=1)
    shaped = tmp_path / "tie-shift.toml"
    shaped.write_text(tie.read_text().replace('name = "tie-4"', 'name = "tie-shift"')
                      .replace('candidate = "one-victim"', 'candidate = "one-victim"\nshift = true'))
    res = patchkit("verify", "--workload", str(shaped), "--report-dir", str(tmp_path / "shift"),
                   env={"PATCHKIT_ATTEMPTS": "1"})
    assert res.returncode == errors.INCONCLUSIVE, res.stdout[-3000:] + res.stderr[-2000:]
    assert "INCONCLUSIVE" in res.stdout and "1 inconclusive" in res.stdout and "shift-exercised" in res.stdout
    rep = json.loads((tmp_path / "shift" / "report.json").read_text())
    assert rep["outcome"] == "INCONCLUSIVE" and rep["ok"] is True and not rep["checks"]["fail"]
    assert rep["checks"]["inconclusive"] == {"shift-exercised": 1}
