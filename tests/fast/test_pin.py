"""pin: pr-set.json edits that keep every other byte, and refusals that write nothing."""
import json

import pytest

from toolkit import pin
from toolkit.errors import ReportError, UsageError

SHA_A = "a" * 40
SHA_B = "b" * 40
SHA_C = "c" * 40
URL = "https://github.com/ggml-org/llama.cpp/pull/{}/commits/{}"

PR_SET = """{
  "_doc": [
    "Our own words: pins for the nightly. Keep this text exactly as it is,",
    "including \\"quotes\\", unicode \u2713 and the odd   spacing."
  ],
  "prs": [
    "https://github.com/ggml-org/llama.cpp/pull/100/commits/%s",
    {"url": "https://github.com/unslothai/llama.cpp/pull/7/commits/%s", "required": false}
  ]
}
""" % (SHA_A, SHA_B)


@pytest.fixture
def files(tmp_path):
    f = tmp_path / "pr-set.json"
    f.write_text(PR_SET)

    def report(sha, ok=True, name="report.json"):
        r = tmp_path / name
        r.write_text(json.dumps({"ok": ok, "candidate_source_commit": sha,
                                 "workloads": {"overflow-4": {"ok": ok}}}))
        return r
    return f, report


def test_add_appends_one_entry_and_keeps_the_rest(files):
    f, report = files
    res = pin.pin(f, URL.format(200, SHA_C), report(SHA_C))
    assert res.action == "added"
    new = f.read_text()
    expected = PR_SET.replace('"required": false}\n', '"required": false},\n    "%s"\n' % URL.format(200, SHA_C))
    assert new == expected
    assert json.loads(new)["prs"][-1] == URL.format(200, SHA_C)


def test_newer_commit_replaces_that_prs_entry(files):
    f, report = files
    res = pin.pin(f, URL.format(100, SHA_C), report(SHA_C))
    assert res.action == "replaced"
    assert f.read_text() == PR_SET.replace(SHA_A, SHA_C)


def test_replacing_an_optional_entry_keeps_the_object(files):
    f, report = files
    url = f"https://github.com/unslothai/llama.cpp/pull/7/commits/{SHA_C}"
    pin.pin(f, url, report(SHA_C), optional=True)
    assert f.read_text() == PR_SET.replace(SHA_B, SHA_C)


def test_optional_writes_an_object(files):
    f, report = files
    pin.pin(f, URL.format(300, SHA_C), report(SHA_C), optional=True)
    assert json.loads(f.read_text())["prs"][-1] == {"url": URL.format(300, SHA_C), "required": False}


def test_dry_run_writes_nothing(files):
    f, report = files
    res = pin.pin(f, URL.format(200, SHA_C), report(SHA_C), dry_run=True)
    assert res.changed and f.read_text() == PR_SET


def test_same_pin_is_unchanged(files):
    f, report = files
    assert pin.pin(f, URL.format(100, SHA_A), report(SHA_A)).action == "unchanged"
    assert f.read_text() == PR_SET


def test_empty_list(tmp_path, files):
    _, report = files
    f = tmp_path / "empty.json"
    f.write_text('{"_doc": ["x"], "prs": []}\n')
    pin.pin(f, URL.format(1, SHA_C), report(SHA_C))
    assert json.loads(f.read_text())["prs"] == [URL.format(1, SHA_C)]
    assert f.read_text().endswith("}\n")


@pytest.mark.parametrize("bad", [
    "https://github.com/ggml-org/llama.cpp/pull/100",
    "https://github.com/ggml-org/llama.cpp/pull/100/commits/abc123",
    "https://github.com/someone/llama.cpp/pull/100/commits/" + SHA_C,
    "https://gitlab.com/ggml-org/llama.cpp/pull/100/commits/" + SHA_C,
])
def test_bad_url_refused_file_untouched(files, bad):
    f, report = files
    with pytest.raises(UsageError):
        pin.pin(f, bad, report(SHA_C))
    assert f.read_text() == PR_SET


def test_other_owner_allowed_by_option(files):
    f, report = files
    url = "https://github.com/someone/llama.cpp/pull/5/commits/" + SHA_C
    assert pin.pin(f, url, report(SHA_C), owners=pin.OWNERS + ("someone",)).action == "added"


def test_malformed_json_refused_byte_identical(tmp_path, files):
    _, report = files
    f = tmp_path / "broken.json"
    broken = PR_SET.replace('"prs": [', '"prs": [,')
    f.write_text(broken)
    with pytest.raises(UsageError):
        pin.pin(f, URL.format(200, SHA_C), report(SHA_C))
    assert f.read_text() == broken


def test_report_for_another_commit_refused(files):
    f, report = files
    with pytest.raises(ReportError) as e:
        pin.pin(f, URL.format(200, SHA_C), report(SHA_A))
    assert SHA_A in str(e.value) and f.read_text() == PR_SET


def test_failing_report_refused(files):
    f, report = files
    with pytest.raises(ReportError) as e:
        pin.pin(f, URL.format(200, SHA_C), report(SHA_C, ok=False))
    assert "failing" in str(e.value) and f.read_text() == PR_SET


def test_missing_report_refused(files, tmp_path):
    f, _ = files
    with pytest.raises(ReportError):
        pin.pin(f, URL.format(200, SHA_C), tmp_path / "nope.json")
    assert f.read_text() == PR_SET


def test_sample_of_the_real_shape_round_trips(tmp_path, files):
    """fixtures/pr-set.sample.json has the fork file's shape: an append changes only the list's tail."""
    _, report = files
    from pathlib import Path
    sample = Path(__file__).resolve().parents[2] / "fixtures" / "pr-set.sample.json"
    f = tmp_path / "pr-set.json"
    f.write_bytes(sample.read_bytes())
    pin.pin(f, URL.format(424242, SHA_C), report(SHA_C))
    old, new = sample.read_text(), f.read_text()
    cut = old.rindex('"', 0, old.rindex("]")) + 1
    assert new == old[:cut] + ',\n    "' + URL.format(424242, SHA_C) + '"' + old[cut:]
    pin.pin(f, URL.format(22222, SHA_A), report(SHA_A))
    assert f.read_text() == new.replace("2" * 40, SHA_A)


def test_a_gate_json_lets_each_pin_it_added_land(files, tmp_path):
    """`patchkit ci` over several added pins: its gate.json (not a single-commit report) gates each."""
    f, _ = files
    gate = tmp_path / "gate.json"

    def write(ok, culprits=()):
        gate.write_text(json.dumps({"ok": ok, "after": {}, "changed": [
            {"pin": "ggml-org/llama.cpp#200", "url": URL.format(200, SHA_C)},
            {"pin": "ggml-org/llama.cpp#300", "url": URL.format(300, SHA_B)}],
            "culprits": [{"pin": c} for c in culprits]}))
    write(True)
    assert pin.pin(f, URL.format(300, SHA_B), gate).action == "added"
    with pytest.raises(ReportError, match="not " + SHA_A):
        pin.pin(f, URL.format(100, SHA_A), gate)
    before = f.read_text()
    write(False, ["ggml-org/llama.cpp#200"])
    with pytest.raises(ReportError, match=r"failing gate \(responsible: ggml-org/llama.cpp#200\)"):
        pin.pin(f, URL.format(200, SHA_C), gate)
    assert f.read_text() == before


def test_dispatch_urls_apply_as_pin_would():
    from toolkit import mix
    old = mix.parse(PR_SET)
    moved = mix.with_pins(old, [pin.parse_url(URL.format(100, SHA_C)),
                                pin.parse_url("https://github.com/unslothai/llama.cpp/pull/7/commits/" + SHA_A),
                                pin.parse_url(URL.format(5, SHA_B))])
    assert [(e.pin.pr, e.pin.sha, e.required) for e in moved] == [(100, SHA_C, True), (7, SHA_A, False), (5, SHA_B, True)]
