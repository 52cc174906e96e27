"""llama.cpp's own server tests (tools/server/tests of the tree, unedited), offline, on layout C2:
the CI subset passes on both sides of the eviction patch with no regression, and a deliberately
harmful commit (/tokenize drops the last token when it parses special tokens, the default) is
named as a regression, with the suite's own failure message, in exactly the tests that use
/tokenize. Builds: the shared c2_base and c2_patched binaries; the harmful commit recompiles one
server TU."""
import git

from toolkit import upstream

from .conftest import commit_on

SERVER = "tools/server/server-context.cpp"
ANCHOR = "llama_tokens tokens = tokenize_mixed(ctx_server.vocab, body.at(\"content\"), add_special, parse_special);"


def _leftovers(res):
    return [x for r in res.runs for x in r.leftovers]


def test_ci_subset_passes_on_both_sides_of_the_eviction_patch(c2, c2_base, c2_patched, tmp_path):
    """Through the command a user types, every option of `upstream-tests` given."""
    import json
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "toolkit", "upstream-tests", "--repo", str(c2.path), "--base", c2.commit,
                          "--candidate", c2_patched.commit, "--tests", "ci", "--repeat", "1", "--text-model", "tiny",
                          "--timeout", "120", "--report-dir", str(tmp_path), "--json"], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    c = json.loads(res.stdout)
    both = set(c["passed_before"]) & set(c["passed_after"])
    # measured on C2 with the tiny model: tokenize/detokenize, server start, props, models, slots,
    # aliases, completions (stream vs non-stream, same seed, n_probs ...) pass on both sides
    assert len(both) >= 8, c["counts"]
    assert c["regressions"] == [], c["regressions"]
    assert c["ok"] and not c["flaky"] and c["tests"] == ["ci"] and c["text_model"] == "tiny"
    # every test of the subset that did not run says why, and the subset's servers all stopped
    assert all(x["why"] for x in c["not_run"])
    assert [x for r in c["runs"] for x in r["leftover_servers"]] == []
    assert [r["side"] for r in c["runs"]] == ["base", "candidate"]
    assert [r["commit"] for r in c["runs"]] == [c2.commit, c2_patched.commit]
    assert all(r["binary"].endswith("llama-server") for r in c["runs"])
    assert (tmp_path / "base" / "junit.xml").exists() and (tmp_path / "candidate" / "junit.xml").exists()


def test_a_harmful_commit_is_named_with_its_failure_message(c2, c2_base, tmp_path):
    repo = git.Repo(c2.path)
    text = repo.commit(c2.commit).tree[SERVER].data_stream.read().decode()
    assert text.count(ANCHOR) == 1, "the /tokenize handler moved: update the anchor"
    broken = text.replace(ANCHOR, ANCHOR + "\n            if (parse_special && !tokens.empty()) {"
                                           " tokens.pop_back(); }")
    bad = commit_on(repo, c2.commit, {SERVER: broken}, "server: /tokenize trims the special-token tail")
    res = upstream.run(repo, c2.commit, bad, candidate_label="harmful", tests=["ci"], out_dir=tmp_path)
    c = res.comparison
    regs = {r.id: r.message for r in c.regressions}
    assert "unit.test_tokenize::test_tokenize_detokenize" in regs, upstream.text_summary(res)
    # the suite's own assertion, as pytest reported it: the round trip lost the last token (" ?")
    assert "What is the capital of France" in regs["unit.test_tokenize::test_tokenize_detokenize"]
    assert not c.ok
    # measured: exactly the two tests that go through /tokenize are blamed (the completion from
    # /tokenize's ids compares its output with the prompt given as text); the rest still passes
    assert set(regs) == {"unit.test_tokenize::test_tokenize_detokenize",
                         "unit.test_completion::test_completion_with_tokens_input"}, regs
    assert set(c.passed_before) - set(c.passed_after) == set(regs)
    assert len(set(c.passed_before) & set(c.passed_after)) >= 8
    assert _leftovers(res) == []
