"""Issue 17: every check can kill. Each mutant of the catalog (patch.toml: one structural switch of
the patch flipped) is built on the default tree (one TU on the shared base build) and judged by
the workload made to expose it; the test asserts WHICH check killed it and for WHAT reason. The
whole catalog runs in `patchkit mutants` (README: the mutation table); this is the sample that
proves each kind of check fails when it should."""
import re

import git
import pytest

from toolkit import apply, build, measure, mutate, patch, source, verify, workload
from toolkit.ui import UI


def kill(c2, tmp_path, name, wl, judges=("suite",)):
    repo = git.Repo(c2.path)
    base = source.resolve(repo, source.BASELINE_TAG)
    right, an = apply.candidate_commit(repo, base)
    res = mutate.run_mutant(repo, base, name, mutate.catalog()[name], [workload.load(wl)] if wl else [], repeat=1,
                            right_tree=repo.commit(right).tree, layout=an.facts.layout, opts=build.Options(),
                            out_dir=tmp_path, reuse={}, say=lambda s: None, progress=lambda s: None,
                            judges=judges)
    assert res.status == "killed", (name, res)
    return {k.check: k.reason for k in res.kills}


def test_victim_chosen_by_prompt_length_is_caught_where_cells_and_prompts_disagree(c2, c2_base, tmp_path):
    k = kill(c2, tmp_path, "victim-by-prompt", "cells-not-prompt")
    m = re.search(r"terminated \[(\d)\], measured largest: \[(\d)\]", k["victim-is-largest"])
    assert m, k
    # the slot with the longest prompt (70 tokens: slot 3) went, while a short-prompt slot held the most
    assert m[1] == "3" and m[2] != "3", k["victim-is-largest"]


def test_victim_chosen_by_tokens_generated_is_caught(c2, c2_base, tmp_path):
    """Through the command a user types (`patchkit mutants`, every option of it given), so the
    campaign's own judges (static checks, property harness, the suite) all run."""
    import json
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "toolkit", "mutants", "--repo", str(c2.path), "--base",
                          source.BASELINE_TAG, "--patch", "evict-largest-slot", "--mutant", "victim-by-generated",
                          "--workload", "overflow-4", "--repeat", "1", "--report-dir", str(tmp_path), "--json"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    doc = json.loads(res.stdout)
    assert doc["score"] == {"killed": 1, "judged": 1} and doc["base"] == c2.commit
    # the suite ran the catalog's one build with this variant selected (issue 37)
    kind, sha, k = doc["mutants"][0]["built"].split()
    assert kind == "schema" and f"{k}: victim-by-generated" in git.Repo(c2.path).commit(sha).message
    assert json.loads((tmp_path / "mutants.json").read_text()) == doc
    k = {x["check"]: x["reason"] for x in doc["mutants"][0]["kills"]}
    # released together the slots generated about as much (which one leads depends on when each
    # prompt finished): a slot went by its generated count, never the one holding the most (slot 3)
    m = re.search(r"terminated \[(\d)\], measured largest: \[3\]", k["victim-is-largest"])
    assert m and m[1] != "3", k

def test_a_victim_entry_left_in_the_batch_shows_in_the_pools_accounting(c2, c2_base, tmp_path):
    """The review's 'nothing requires the batch surgery': the kept entry is decoded into a freed
    pool, one cell taken by no slot in play; two-overflows' second overflow does not add up."""
    k = kill(c2, tmp_path, "entries-kept", "two-overflows")
    assert re.search(r"WRONG .*1 cell\(s\) taken by no slot in play", k["one-victim-per-overflow"]), k


def test_a_victim_in_its_prompt_is_measured_and_its_kept_chunk_shows(c2, c2_base, tmp_path):
    """prompt-victim: the pool runs out while slot 3 is in its 960-token prompt (upstream logs no
    decode line for a prompt chunk; its chunk line names the cells it held as the chunk joined the
    batch, and the pool's accounting must agree). The right patch terminates it, measured the
    largest by hundreds of cells; a patch that leaves its undecoded chunk in the batch has the
    chunk decoded into the freed cells, which no slot holds (tens of cells, not one)."""
    res = verify.verify(git.Repo(c2.path), base_ref=source.BASELINE_TAG, workloads=[workload.load("prompt-victim")],
                        out_dir=tmp_path / "right", ui=UI(quiet=True))
    assert res.ok, [(v.side, c.name, c.detail) for wr in res.results for v in wr.verdicts for c in v.checks if not c.ok]
    wr = res.results[0]
    ev, = measure.overflows(wr.candidate[0], wr.workload)
    at = {s.slot: s for s in ev.in_play}
    assert ev.terminated == (3,) and ev.full and at[3].generated == 0
    assert at[3].source == "server log (its prompt chunk)"
    assert at[3].cells > max(at[j].cells for j in (0, 1, 2)) + 300, at
    k = kill(c2, tmp_path, "entries-kept", "prompt-victim")
    m = re.search(r"WRONG .* (\d+) cell\(s\) taken by no slot in play", k["one-victim-per-overflow"])
    assert m and int(m[1]) > 1, k


def test_two_victims_in_one_step_are_caught(c2, c2_base, tmp_path):
    k = kill(c2, tmp_path, "two-victims", "overflow-4")
    assert re.search(r"WRONG t=[\d.]+ s: terminated \[\d, \d\]", k["one-victim-per-overflow"]), k


def test_survivors_that_skip_a_sample_are_caught_from_upstreams_log(c2, c2_base, tmp_path):
    # victim-first: the victim's entry is first in the batch, so survivors sit past the failure
    # offset by design (shift). In overflow-4 a start that failed at off 3 had every survivor
    # sampled already, the reset changed nothing, and the mutant passed (a clean-clone run)
    k = kill(c2, tmp_path, "survivors-reset", "victim-first")
    assert "(the previous token again: a step without a sample)" in k["one-sample-per-entry"], k


def test_decoded_entries_moved_are_caught_where_the_victim_was_decoded_first(c2, c2_base, tmp_path):
    """victim-decoded fails at off 3 by arithmetic, the victim's entry (position 0) decoded: removing
    from the whole batch pulls a survivor's undecoded entry below off, where it is never decoded."""
    k = kill(c2, tmp_path, "remove-from-zero", "victim-decoded")
    assert re.search(r"slot \d: \d+ tokens decoded for \d+ sampled|decode #\d+ entered token",
                     k.get("one-sample-per-entry", "")), k


def test_a_victim_left_to_the_http_cancel_is_caught_by_the_step_it_was_released_in(c2, c2_base, tmp_path):
    """victim-not-released: error sent, cells freed, slot.release() left out. The HTTP layer's
    cancel releases the slot, usually before the next step, so no entry of the task follows and
    the stream looks right (ALIVE in every run until the release's step was judged): the server's
    loop takes the cancel only between steps, so the release lands after the loop's turn."""
    k = kill(c2, tmp_path, "victim-not-released", "overflow-4")
    assert re.search(r"slot \d \(task \d+\) was not released in the step that sent it the error: released only "
                     r"after the step ended", k["victim-stops"]), k


@pytest.mark.parametrize("name,check", [("spec-not-remapped", "spec-indices-remapped"),
                                        ("embd-not-compacted", "embd-compacted")])
def test_presence_checks_catch_a_missing_piece_without_a_build(c2, tmp_path, name, check):
    """Speculative batches never reach the handler (measured: speculative.toml), so only the
    presence check on the patched TU (libclang) sees a spec_i_batch left out of the shift."""
    k = kill(c2, tmp_path, name, None, judges=("static",))
    assert k[check].startswith("absent:"), k


def test_every_mutant_differs_from_the_right_patch_on_the_default_tree(c2, tmp_path):
    repo = git.Repo(c2.path)
    base = source.resolve(repo, source.BASELINE_TAG)
    right, _ = apply.candidate_commit(repo, base)
    text = repo.git.show(f"{right}:tools/server/server-context.cpp")
    assert "patchkit" not in text.lower()
    for name in mutate.catalog():
        sha, _ = apply.candidate_commit(repo, base, variant=name)
        assert repo.commit(sha).tree != repo.commit(right).tree, name
        assert patch.state(repo.git.show(f"{sha}:tools/server/server-context.cpp"), patch.load_patch()) == "applied"


def test_a_survivors_sampler_reset_is_seen_by_the_witness_and_not_by_the_tiny_model(c2, c2_base, tmp_path):
    """Issue 33: the same wrong patch, the same workload (stateful-4: seeded temperature and
    penalties), two models. By the time the pool runs out the tiny model's stream has collapsed
    into one repeated token, so survivors whose sampler was reset at the eviction still equal
    their control: ALIVE. The witness's next token depends on the sampler's state: killed, by a
    stream check only (nothing structural changed), at a token after the survivor's overflow."""
    import json
    import subprocess
    import sys

    def campaign(*model):
        out = tmp_path / (model[-1] if model else "default")
        res = subprocess.run([sys.executable, "-m", "toolkit", "mutants", "--repo", str(c2.path), "--base",
                              source.BASELINE_TAG, "--mutant", "survivors-sampler-reset", "--workload", "stateful-4",
                              *model, "--report-dir", str(out)], capture_output=True, text=True)
        doc = json.loads((out / "mutants.json").read_text())
        # the variant is selected in its family's one schema build, and the campaign says so
        assert re.search(r"^catalog: 1 of the 1 variants in one build \([0-9a-f]{12}; PATCHKIT_VARIANT=K selects",
                         res.stdout + res.stderr, re.M), res.stdout[-2000:] + res.stderr[-2000:]
        assert doc["mutants"][0]["built"].startswith("schema "), doc["mutants"][0]["built"]
        return res.returncode, doc
    rc, tiny = campaign("--model", "tiny")
    assert tiny["model"] == "tiny" and rc == 1, tiny["score"]
    m, = tiny["mutants"]
    assert m["status"] == "ALIVE" and m["kills"] == [], m
    rc, witness = campaign()
    assert witness["model"] == "" and rc == 0, witness["score"]
    m, = witness["mutants"]
    assert m["status"] == "killed", m
    # integrity alone (an earlier start, made again for its shape, is judged too: by integrity)
    assert {k["check"] for k in m["kills"]} <= {"integrity", "earlier-starts"}, m["kills"]
    assert all(" integrity: " in k["reason"] for k in m["kills"] if k["check"] == "earlier-starts"), m["kills"]
    k = next(k for k in m["kills"] if k["check"] == "integrity")
    assert re.search(r"slot \d: differs from control at token (\d+)", k["reason"]), k
    # the overflow of stateful-4 comes ~186 tokens in (victim-first's arithmetic): the first
    # difference is after it, where the reset happened
    assert all(int(x) >= 180 for x in re.findall(r"differs from control at token (\d+)", k["reason"])), k


@pytest.mark.parametrize("family", ["evict-largest-slot", "park-slot", "recompute-slot", "hybrid-slot"])
def test_a_familys_catalog_is_one_build_that_is_each_variant_when_selected(c2, c2_base, family):
    """Issue 37: the family's whole catalog in one build (toolkit/variant_schema.py). The schema's
    file, with variant K selected, is line for line the file of that variant's own commit, and
    with none selected the right patch's; every variant that differs on the default tree is in it
    (measured: none needs to be built alone); a second call reads the cache: no parse, no build."""
    from toolkit import variant_schema

    repo = git.Repo(c2.path)
    base = source.resolve(repo, source.BASELINE_TAG)
    right, an = apply.candidate_commit(repo, base, family)
    sha, schema = mutate.catalog_schema(repo, base, family, build.Options(), lambda s: None)
    assert build.build(repo, sha, build.Options(), lambda s: None).reused, "the schema is built"

    def file(commit):
        return repo.git.show(f"{commit}:{an.file}")
    text = file(sha)
    assert variant_schema.project(text, 0) == file(right) and text != file(right)
    differs = []
    for name in mutate.catalog(family):
        cand, _ = apply.candidate_commit(repo, base, family, variant=name)
        changed = repo.git.diff("--name-only", right, cand).split()
        if not changed:
            continue
        assert changed == [an.file], (name, changed)   # a variant is one file: the patch's
        differs.append(name)
        if name in schema.ids:
            assert variant_schema.project(text, schema.ids[name]) == file(cand), name
    assert differs and sorted(schema.ids) == sorted(differs), schema.alone
    said = []
    again = mutate.catalog_schema(repo, base, family, build.Options(), said.append)
    assert again[1] == schema and repo.commit(again[0]).tree == repo.commit(sha).tree
    assert not [s for s in said if "parsing" in s or "building" in s], said
