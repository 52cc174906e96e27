"""Issue 26: mutants nobody designed. A seeded sample of the operator mutants of the eviction's
added lines on C2, all compiled into ONE schema binary (one TU on the shared build), each
selected at run time and judged by the default suite, stopping at its first failed check. Every
sampled mutant is killed, or argued equivalent in patch.toml with its measurement."""
import json
import subprocess
import sys

from toolkit import patch, source, verify


def test_a_seeded_sample_of_operator_mutants_is_killed_or_argued(c2, c2_base, tmp_path):
    res = subprocess.run([sys.executable, "-m", "toolkit", "mutants", "--repo", str(c2.path), "--base",
                          source.BASELINE_TAG, "--operators", "--sample", "10", "--seed", "26", "--shard", "1/1",
                          "--report-dir", str(tmp_path), "--json"], capture_output=True, text=True)
    doc = json.loads(res.stdout)
    assert res.returncode == 0, [m for m in doc["mutants"] if m["status"] == "ALIVE"]
    assert doc == json.loads((tmp_path / "operators.json").read_text())
    assert len(doc["mutants"]) == 10 and doc["generated"] >= 60, doc["generated"]
    assert doc["alive"] == 0 and doc["killed"] + sum(m["status"] == "equivalent" for m in doc["mutants"]) == 10
    argued = {(e["operator"], e["context"], e["original"], e["mutated"]) for e in patch.load_patch().equivalent}
    for m in doc["mutants"]:
        if m["status"] == "killed":
            assert m["check"] and m["reason"] and (m["where"] == "property harness" or
                                                   m["where"].split()[0] in verify.SUITE), m
        else:
            assert (m["operator"], m["context"], m["original"], m["mutated"]) in argued, m
    # the other half of a sharded campaign is a different set of mutants
    res2 = subprocess.run([sys.executable, "-m", "toolkit", "mutants", "--repo", str(c2.path), "--operators",
                           "--sample", "10", "--seed", "26", "--shard", "2/2", "--workload", "overflow-4",
                           "--report-dir", str(tmp_path / "s2"), "--json"], capture_output=True, text=True)
    ids2 = {m["id"] for m in json.loads(res2.stdout)["mutants"]}
    assert ids2 and ids2 < {m["id"] for m in doc["mutants"]}
    # plan -> shards -> merge: shard 1/2 too, then the join holds every mutant of the sample once
    res1 = subprocess.run([sys.executable, "-m", "toolkit", "mutants", "--repo", str(c2.path), "--operators",
                           "--sample", "10", "--seed", "26", "--shard", "1/2", "--workload", "overflow-4",
                           "--report-dir", str(tmp_path / "s1"), "--json"], capture_output=True, text=True)
    merged = subprocess.run([sys.executable, "-m", "toolkit", "mutants", "--merge", str(tmp_path / "s1"), "--merge",
                             str(tmp_path / "s2"), "--report-dir", str(tmp_path / "all"), "--json"],
                            capture_output=True, text=True)
    mdoc = json.loads(merged.stdout)
    assert sorted(m["id"] for m in mdoc["mutants"]) == sorted(m["id"] for m in doc["mutants"]), res1.stderr[-500:]
    assert (mdoc["generated"], mdoc["schema_tree"]) == (doc["generated"], doc["schema_tree"])
    assert merged.returncode == (1 if mdoc["alive"] else 0)
