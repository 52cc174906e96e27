"""Issue 13 for real: `patchkit ci` judges the nightly before and after a pr-set.json change,
on the default tree, with pins made by the test as commits a contributor would push:

  E  the eviction patch (patchkit's series on the base)
  H  a harmless, unrelated change (docs)
  R  a regression: slot 1's token budget capped at 200 (one survivor loses its last 40 tokens)
  N  the eviction without the index remap (the `no-remap` variant)
  X  on a base that already carries the eviction: a pin that takes it out again
  B  a pin that does not compile
  T  /tokenize drops the last token when it parses special tokens: no workload sees it, upstream's
     own server tests do

Each gate builds the mixes in the cached tree's object store (no checkout touched); a build
of a tree seen before is a cache hit, so only the mixes with R cost a compile."""
import json
import subprocess
import sys

import git
import pytest

from toolkit import apply

from .conftest import commit_on

SERVER = "tools/server/server-context.cpp"
BUDGET = "        slot.n_predict_max = task.params.n_predict != -1 ? task.params.n_predict : params_base.n_predict;\n"
WORKLOADS = "overflow-4,victim-first,fits"
TOKENIZE = "llama_tokens tokens = tokenize_mixed(ctx_server.vocab, body.at(\"content\"), add_special, parse_special);"


def patchkit(*args):
    return subprocess.run([sys.executable, "-m", "toolkit", *args], capture_output=True, text=True)


def url(pr: int, sha: str) -> str:
    return f"https://github.com/ggml-org/llama.cpp/pull/{pr}/commits/{sha}"


@pytest.fixture(scope="module")
def pins(c2, c2_patched):
    repo = git.Repo(c2.path)
    base = c2.commit
    text = repo.git.show(f"{base}:{SERVER}") + "\n"
    assert BUDGET in text, "the regression's anchor moved: update BUDGET for this tree"
    evict = apply.candidate_commit(repo, base)[0]
    return {
        "base": base,
        "E": evict,
        "H": commit_on(repo, base, {"docs/patchkit-gate-note.md": "A harmless pin: docs only.\n"}, "docs: a note"),
        "R": commit_on(repo, base, {SERVER: text.replace(BUDGET, BUDGET + (
            "        if (slot.id == 1 && slot.n_predict_max > 200) { slot.n_predict_max = 200; }  // a deliberate regression\n"))},
            "server: cap slot 1's budget"),
        "N": apply.candidate_commit(repo, base, variant="no-remap")[0],
        "X": commit_on(repo, evict, {SERVER: text}, "server: take the eviction out again"),
        "B": commit_on(repo, base, {SERVER: text.replace(BUDGET, BUDGET + "        this_is_not_cpp = ;\n")},
                       "server: a typo"),
        "T": commit_on(repo, base, {SERVER: text.replace(TOKENIZE, TOKENIZE + "\n            if (parse_special && "
                                                         "!tokens.empty()) { tokens.pop_back(); }")},
                       "server: /tokenize trims the special-token tail"),
    }


def pr_set(tmp_path, name, entries) -> str:
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps({"_doc": ["test"], "prs": entries}, indent=2) + "\n")
    return str(p)


def ci(c2, tmp_path, name, old, new, *extra, base=None):
    out = tmp_path / name
    res = patchkit("ci", "--repo", c2.path, "--base", base or c2.commit, "--old-pr-set", pr_set(tmp_path, name + "-old", old),
                   "--pr-set", pr_set(tmp_path, name + "-new", new),
                   *(() if "--workload" in extra else ("--workload", WORKLOADS)),
                   "--report-dir", str(out), "--summary", str(tmp_path / f"{name}.md"), *extra)
    data = json.loads((out / "gate.json").read_text()) if (out / "gate.json").exists() else None
    return res, data


def failing(data) -> dict[str, list[str]]:
    return {name: w["failed"] for name, w in data["workloads"].items() if w["failed"]}


def test_three_added_pins_name_the_regressing_one(c2, pins, tmp_path):
    E, H, R = url(101, pins["E"]), url(102, pins["H"]), url(103, pins["R"])
    res, data = ci(c2, tmp_path, "ehr", [], [E, H, R])
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert [c["pin"] for c in data["culprits"]] == ["ggml-org/llama.cpp#103"], data["culprits"]
    # why: R's slot 1 stops at 200 of 240 tokens: a survivor that completed before now does not
    blame = {b["pin"]: b for b in data["blame"]}
    assert blame["ggml-org/llama.cpp#101"]["ok"] and blame["ggml-org/llama.cpp#102"]["ok"]
    assert any("no-regression: slot 1: completed (240 tokens) -> truncated (200 tokens)" in f
               for f in blame["ggml-org/llama.cpp#103"]["failed"]), blame
    assert data["expect"] == "eviction" and "measured" in data["expect_why"]
    md = (tmp_path / "ehr.md").read_text()
    assert "## patchkit pin gate: FAIL" in md and "responsible pin**: ggml-org/llama.cpp#103" in md
    assert "| workload | run | slot | prompt | before | after | error |" in md
    assert "| fits **FAIL** | 0 | 1 |" in md and "truncated 200/240" in md
    # without the regressing pin the same change passes, with the eviction expectations
    res, data = ci(c2, tmp_path, "eh", [], [E, H])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert data["ok"] and not data["culprits"] and data["expect"] == "eviction"
    after = json.loads((tmp_path / "eh" / "report.json").read_text())
    checks = {c["name"] for v in after["workloads"]["victim-first"]["verdicts"] if v["side"] == "candidate"
              for c in v["checks"]}
    assert {"victim-is-largest", "integrity", "no-regression", "shift-exercised"} <= checks


def test_a_harmless_pin_is_judged_for_no_regression(c2, pins, tmp_path):
    res, data = ci(c2, tmp_path, "h", [], [url(102, pins["H"])])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert data["expect"] == "no-regression" and "does not evict" in data["expect_why"]
    # the base side is the reference: its all-error outcome is what the pin is compared with
    rep = json.loads((tmp_path / "h" / "report.json").read_text())
    base_checks = {c["name"]: c["status"] for v in rep["workloads"]["overflow-4"]["verdicts"] if v["side"] == "base"
                   for c in v["checks"]}
    assert base_checks["reference"] == "skip" and "all-slots-errored" not in base_checks


def test_the_no_remap_pin_fails_for_integrity(c2, pins, tmp_path):
    res, data = ci(c2, tmp_path, "n", [url(102, pins["H"])], [url(102, pins["H"]), url(104, pins["N"])],
                   "--workload", "victim-first")
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert [c["pin"] for c in data["culprits"]] == ["ggml-org/llama.cpp#104"]
    fails = failing(data)
    integ = [f for f in fails["victim-first"] if " integrity: " in f]
    assert integ and "differs from control at token" in integ[0], fails
    # nothing else failed but what a missing remap causes: corrupted survivor streams, and a slot
    # whose moved entry went unsampled (upstream's log: it decoded its previous token again)
    # (and the same, in a start made again for its shape: every start is judged)
    assert all(" integrity: " in f or ("no-regression" in f and "tokens differ" in f)
               or " one-sample-per-entry: " in f or " earlier-starts: " in f for f in fails["victim-first"]), fails
    assert set(fails) == {"victim-first"}, fails


def test_a_parking_pin_is_judged_as_a_preemption_and_a_broken_one_named(c2, pins, tmp_path):
    """The fork's park PR as a pin: the gate measures parks in the after nightly and judges it with
    the preemption expectations (no request fails, every pause ends, streams exact); the same
    pin with resume never called is named, through the wait bound."""
    repo = git.Repo(c2.path)
    park = apply.candidate_commit(repo, c2.commit, "park-slot")[0]
    stuck = apply.candidate_commit(repo, c2.commit, "park-slot", variant="never-resumed")[0]
    res, data = ci(c2, tmp_path, "park", [], [url(184, park)], "--workload", "overflow-4,fits")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert data["expect"] == "preemption" and "the candidate preempts (measured" in data["expect_why"], data["expect_why"]
    res, data = ci(c2, tmp_path, "stuck", [], [url(185, stuck)], "--workload", "overflow-4")
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert [c["pin"] for c in data["culprits"]] == ["ggml-org/llama.cpp#185"], data["culprits"]
    assert any(" waits-bounded: " in f and "never resumed" in f for f in failing(data)["overflow-4"]), failing(data)


def test_a_base_that_already_evicts(c2, pins, tmp_path):
    """The base carries the eviction (it landed upstream): a harmless pin passes with the eviction
    expectations, the base a reference; a pin that takes the eviction out fails for no-regression."""
    H, X = url(102, pins["H"]), url(105, pins["X"])
    res, data = ci(c2, tmp_path, "bh", [], [H], base=pins["E"])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert data["expect"] == "eviction" and "the base side already evicts" in data["expect_why"]
    res, data = ci(c2, tmp_path, "bx", [], [X], base=pins["E"])
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert data["expect"] == "no-regression" and [c["pin"] for c in data["culprits"]] == ["ggml-org/llama.cpp#105"]
    assert any("no-regression: slot 0: completed (240 tokens) -> errored" in f for f in failing(data)["overflow-4"])


def test_sharded_gate_gives_the_unsharded_verdicts(c2, pins, tmp_path):
    """`ci --plan` -> one `ci --shard` per matrix entry -> `report merge`: the same verdicts,
    failing checks and responsible pin as one unsharded run."""
    E, R = url(101, pins["E"]), url(103, pins["R"])
    old, new = pr_set(tmp_path, "s-old", []), pr_set(tmp_path, "s-new", [E, R])
    wl = "overflow-4,fits"
    plan = json.loads(patchkit("ci", "--plan", "--old-pr-set", old, "--pr-set", new, "--workload", wl).stdout)
    assert [m["workloads"] for m in plan["include"]] == ["overflow-4", "fits"] and len(plan["key"]) == 16
    dirs = []
    for k, m in enumerate(plan["include"]):
        d = tmp_path / f"shard-{k}"
        patchkit("ci", "--repo", c2.path, "--base", c2.commit, "--old-pr-set", old, "--pr-set", new,
                 "--workload", m["workloads"], "--shard", m["name"], "--report-dir", str(d))
        dirs.append(str(d))
    merged = patchkit("report", "merge", *dirs, "--out", str(tmp_path / "merged"), "--summary", str(tmp_path / "m.md"),
                      "--json")
    whole = patchkit("ci", "--repo", c2.path, "--base", c2.commit, "--old-pr-set", old, "--pr-set", new,
                     "--workload", wl, "--report-dir", str(tmp_path / "whole"))
    assert merged.returncode == whole.returncode == 1, merged.stdout + merged.stderr + whole.stdout[-2000:]
    m = json.loads((tmp_path / "merged" / "gate.json").read_text())
    w = json.loads((tmp_path / "whole" / "gate.json").read_text())
    assert json.loads(merged.stdout) == m, "--json prints the merged gate.json"
    assert m["shards"] == ["overflow-4 #1", "fits #1"]
    assert m["culprits"] == w["culprits"] and [c["pin"] for c in m["culprits"]] == ["ggml-org/llama.cpp#103"]

    def verdicts(d):
        return {n: (x["ok"], sorted(f.split(":")[0] for f in x["failed"])) for n, x in d["workloads"].items()}
    assert verdicts(m) == verdicts(w), (verdicts(m), verdicts(w))
    assert "responsible pin**: ggml-org/llama.cpp#103" in (tmp_path / "m.md").read_text()


def test_a_pin_that_breaks_the_build_is_named(c2, pins, tmp_path):
    """The after nightly does not compile: a failing verdict (exit 1, not a tool error) naming the
    pin whose mix first fails to build, with the compiler's first error; nothing is run."""
    res, data = ci(c2, tmp_path, "hb", [], [url(102, pins["H"]), url(106, pins["B"])])
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert not data["builds"] and [c["pin"] for c in data["culprits"]] == ["ggml-org/llama.cpp#106"]
    assert "the after nightly does not build" in data["note"] and "this_is_not_cpp" in data["note"]
    assert not data["workloads"]
    assert "responsible pin**: ggml-org/llama.cpp#106" in (tmp_path / "hb.md").read_text()


def test_a_pin_only_upstreams_tests_can_see_is_named_through_them(c2, pins, tmp_path):
    """The upstream-tests shard (`--workload none --upstream-tests ...`): eviction + the /tokenize
    breaker added together; llama.cpp's own test fails on the after nightly only, and the mix up to
    each pin is judged on that test: the breaker is named, with the suite's failure message."""
    E, T = url(101, pins["E"]), url(107, pins["T"])
    res, data = ci(c2, tmp_path, "et", [], [E, T], "--workload", "none", "--upstream-tests", "test_tokenize")
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert [c["pin"] for c in data["culprits"]] == ["ggml-org/llama.cpp#107"], data["culprits"]
    up = data["upstream"]
    assert not up["ok"] and not data["workloads"]
    regs = {r["id"]: r["message"] for r in up["regressions"]}
    assert "What is the capital of France" in regs["unit.test_tokenize::test_tokenize_detokenize"], regs
    md = (tmp_path / "et.md").read_text()
    assert "**llama.cpp server tests** (test_tokenize): FAIL" in md and "responsible pin**: ggml-org/llama.cpp#107" in md
