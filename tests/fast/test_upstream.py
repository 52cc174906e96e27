"""llama.cpp's own server tests, the pure parts: junit -> outcomes, the pass-set comparison, the
--tests selection; and the pytest plugin against a fake suite shaped like tools/server/tests
(ServerPreset / ServerProcess / download_file, the autouse load_all fixture), no server started."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from toolkit import upstream
from toolkit.errors import UsageError
from toolkit.upstream import Outcome, Regression

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1" failures="2"
skipped="2" tests="7" time="2.7"><testcase classname="unit.test_tokenize" name="test_tokenize_detokenize" time="0.765" />
<testcase classname="unit.test_tokenize" name="test_tokenize_with_bos" time="0.134"><failure message="assert 112 == 1"
>unit/test_tokenize.py:42: in test_tokenize_with_bos
    assert res_tok.body["tokens"][0] == bosId
E   assert 112 == 1</failure></testcase>
<testcase classname="unit.test_basic" name="test_load_split_model" time="0.001"><skipped type="pytest.skip"
message="patchkit: not run: the test asks for the Hugging Face model ggml-org/models itself (offline: no stand-in)"
>plugin.py:122: patchkit: not run: ...</skipped></testcase>
<testcase classname="unit.test_completion" name="test_completion[Ben-8]" time="0.2"><failure message=""
>unit/test_completion.py:30: in test_completion
E   AssertionError: no match
E   assert False</failure></testcase>
<testcase classname="unit.test_basic" name="test_server_props" time="0.3"><error message="failed on teardown with &quot;boom&quot;"
>teardown</error></testcase>
<testcase classname="unit.test_x" name="test_xfail" time="0.1"><skipped type="pytest.xfail" message="known" /></testcase>
<testcase classname="" name="unit.test_broken" time="0"><error message="collection failure">SyntaxError</error></testcase>
</testsuite></testsuites>"""


def test_parse_junit_outcomes_and_messages():
    got = {o.id: o for o in upstream.parse_junit(JUNIT)}
    assert got["unit.test_tokenize::test_tokenize_detokenize"] == Outcome(
        "unit.test_tokenize::test_tokenize_detokenize", "passed", "", 0.765)
    assert got["unit.test_tokenize::test_tokenize_with_bos"].outcome == "failed"
    assert got["unit.test_tokenize::test_tokenize_with_bos"].message == "assert 112 == 1"
    skip = got["unit.test_basic::test_load_split_model"]
    assert skip.outcome == "skipped" and skip.message.startswith("patchkit: not run: the test asks for")
    # no message attribute: the E lines of the traceback
    assert got["unit.test_completion::test_completion[Ben-8]"].message == "AssertionError: no match / assert False"
    assert got["unit.test_basic::test_server_props"].outcome == "error"
    assert got["unit.test_x::test_xfail"].outcome == "skipped"
    assert got["unit.test_broken"] == Outcome("unit.test_broken", "error", "collection failure", 0.0)
    assert len(got) == 7


def test_parse_junit_keeps_the_failure_of_a_test_reported_twice():
    """A test whose call passed but whose teardown failed can appear as two records."""
    text = """<testsuites><testsuite><testcase classname="m" name="t" time="1" />
    <testcase classname="m" name="t" time="0"><error message="teardown: server still running" /></testcase>
    </testsuite></testsuites>"""
    (o,) = upstream.parse_junit(text)
    assert (o.outcome, o.message) == ("error", "teardown: server still running")


def _o(tid, outcome, msg=""):
    return Outcome(tid, outcome, msg)


def test_compare_pass_sets():
    before = [[_o("a", "passed"), _o("b", "passed"), _o("c", "failed", "x"), _o("d", "failed", "y"),
               _o("e", "skipped", "patchkit: not run: embedding preset"), _o("f", "passed")]]
    after = [[_o("a", "passed"), _o("b", "failed", "assert 500 == 200"), _o("c", "passed"),
              _o("d", "error", "boom"), _o("e", "skipped", "patchkit: not run: embedding preset"),
              _o("f", "passed")]]
    c = upstream.compare(before, after)
    assert c.regressions == (Regression("b", "assert 500 == 200"),)
    assert c.gained == ("c",)
    assert c.not_judged == (("d", "fails on both sides: boom"),)
    assert c.not_run == (("e", "patchkit: not run: embedding preset"),)
    assert c.run == ("a", "b", "c", "d", "f")
    assert c.passed_before == ("a", "b", "f") and c.passed_after == ("a", "c", "f")
    assert not c.ok and c.flaky == ()
    assert upstream.not_run_reasons(c) == {"embedding preset": 1}


def test_compare_flaky_base_is_never_blamed_an_intermittent_candidate_failure_is():
    """A test that flips between base runs is flaky: not a regression. One that passes on every
    base run and fails on some candidate run is an intermittent regression (issue 26), the runs named."""
    before = [[_o("a", "passed"), _o("b", "passed")], [_o("a", "failed", "timeout"), _o("b", "passed")]]
    after = [[_o("a", "failed", "timeout"), _o("b", "passed")], [_o("a", "failed", "timeout"), _o("b", "failed", "z")]]
    c = upstream.compare(before, after)
    assert dict(c.flaky) == {"a": "base: pass, fail"}
    assert c.regressions == (Regression("b", "intermittent: failed in candidate run 2 of 2, passed in all 2 base "
                                             "runs: z"),)
    assert not c.ok and c.passed_before == ("b",)
    # three candidate runs, two failing: both named
    c = upstream.compare([[_o("b", "passed")]] * 3, [[_o("b", "failed", "y")], [_o("b", "passed")], [_o("b", "error", "y")]])
    assert c.regressions[0].message.startswith("intermittent: failed in candidate runs 1, 3 of 3")


def test_compare_repeated_regression_and_absent_tests():
    """Consistent across repeats: judged. A test missing from one run (pytest killed) or skipped on
    one side only is not judged, with why."""
    before = [[_o("a", "passed"), _o("b", "passed"), _o("c", "passed")]] * 2
    after = [[_o("a", "failed", "m1"), _o("b", "passed"), _o("c", "skipped", "s")],
             [_o("a", "failed", "m2"), _o("c", "skipped", "s")]]
    c = upstream.compare(before, after)
    assert c.regressions == (Regression("a", "m1"),)
    nj = dict(c.not_judged)
    assert nj["b"] == "not in every run (base: pass, pass; candidate: pass, absent)"
    assert nj["c"].startswith("not in every run (base: pass, pass; candidate: skip, skip)")
    with pytest.raises(ValueError):
        upstream.compare([], after)


def test_selection(tmp_path):
    unit = tmp_path / "unit"
    unit.mkdir()
    for name in ("test_tokenize.py", "test_basic.py", "test_completion.py"):
        (unit / name).write_text("")
    sel = upstream.selection(["test_tokenize", "unit/test_basic.py::test_server_props", "test_tokenize.py"], tmp_path)
    assert sel == ("unit/test_tokenize.py", "unit/test_basic.py::test_server_props")
    assert upstream.selection(["ci"], tmp_path) == upstream.SUBSETS["ci"]
    with pytest.raises(UsageError, match="no test file unit/test_nope.py.*Subsets: all, ci; files: test_basic.py"):
        upstream.selection(["test_nope"], tmp_path)


def test_plugin_config():
    ps = (upstream.Preset("tinyllama2", "text", "hf", "/m/tiny.gguf", "tiny"),
          upstream.Preset("router", "router", "-", None, "none"),
          upstream.Preset("bert_bge_small", "embedding", "hf", not_run="no embedding model"))
    conf = upstream.plugin_config(ps, {"d.gguf": "/m/draft.gguf"}, timeout=7, leftovers=Path("/x/l.json"))
    assert conf["presets"] == {"tinyllama2": {"model": "/m/tiny.gguf"}, "router": {},
                               "bert_bge_small": {"not_run": "no embedding model"}}
    assert conf["urls"] == {"d.gguf": "/m/draft.gguf"} and conf["timeout"] == 7 and not conf["slow"]


# ------------------------------------------------------------------ the plugin, on a fake suite

UTILS = '''
import os
server_instances = set()

class ServerProcess:
    server_host = "127.0.0.1"
    server_port = 8080
    model_hf_repo = "ggml-org/models"
    model_hf_file = "x.gguf"
    model_url = None
    model_file = None
    model_draft = None
    models_dir = None
    gcp_compat = False
    def start(self):
        self.started_with = {"port": self.server_port, "host": self.server_host,
                             "aip": os.environ.get("AIP_HTTP_PORT"), "model": self.model_file}
        server_instances.add(self)
    def stop(self):
        server_instances.discard(self)

class ServerPreset:
    @staticmethod
    def load_all():
        raise RuntimeError("network!")
    @staticmethod
    def tinyllama2():
        s = ServerProcess()
        s.model_hf_repo = "ggml-org/test-model-stories260K"
        s.model_hf_file = None
        s.n_ctx = 512
        return s
    @staticmethod
    def bert_bge_small():
        return ServerProcess()
    @staticmethod
    def brand_new_preset():
        return ServerProcess()

def download_file(url, output_file_path=None):
    raise RuntimeError("network!")
'''

CONFTEST = '''
import pytest
from utils import *

@pytest.fixture(autouse=True)
def stop_server_after_each_test():
    yield
    for server in set(server_instances):
        server.stop()

@pytest.fixture(scope="session", autouse=True)
def load_server_presets():
    ServerPreset.load_all()
'''

TESTS = '''
import time
import pytest
from utils import *

server = ServerPreset.tinyllama2()   # at import time, as upstream's modules do

def test_text_preset_is_local():
    s = ServerPreset.tinyllama2()
    s.server_host = "0.0.0.0"
    s.start()
    assert s.model_file == MODEL and s.model_hf_repo is None and s.model_hf_file is None and s.n_ctx == 512
    assert s.started_with["host"] == "127.0.0.1" and s.started_with["port"] != 8080
    assert s.started_with["aip"] == str(s.started_with["port"])

def test_module_level_server_too():
    server.start()
    assert server.started_with["model"] == MODEL

def test_embedding_not_run():
    ServerPreset.bert_bge_small().start()

def test_unknown_preset_not_run():
    ServerPreset.brand_new_preset().start()

def test_own_hf_model_not_run():
    s = ServerPreset.tinyllama2()
    s.model_hf_repo = "bartowski/Phi-3.5-mini-instruct-GGUF:Q4_K_M"
    s.start()

def test_draft_mapped():
    assert download_file("https://huggingface.co/ggml-org/tiny-llamas/resolve/main/stories15M-q4_0.gguf") == DRAFT

def test_other_download_not_run():
    download_file("https://huggingface.co/ggml-org/stories15M_MOE/resolve/main/moe_shakespeare15M.gguf")

@pytest.mark.slow
def test_slow():
    pass

def test_hangs():
    while True:
        try:
            time.sleep(0.05)
        except Exception:   # the suite's polling loops swallow Exception: the timeout is not one
            pass
'''


def test_plugin_on_a_fake_suite(tmp_path):
    tests = tmp_path / "tests"
    (tests / "unit").mkdir(parents=True)
    model, draft = tmp_path / "tiny.gguf", tmp_path / "draft.gguf"
    model.write_bytes(b"GGUF")
    draft.write_bytes(b"GGUF")
    (tests / "utils.py").write_text(UTILS)
    (tests / "conftest.py").write_text(CONFTEST)
    (tests / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    (tests / "unit" / "test_fake.py").write_text(f"MODEL = {str(model)!r}\nDRAFT = {str(draft)!r}\n" + TESTS)
    ps = (upstream.Preset("tinyllama2", "text", "hf", str(model), "tiny"),
          upstream.Preset("bert_bge_small", "embedding", "hf", not_run="embedding preset: no local model"))
    conf = upstream.plugin_config(ps, {upstream.DRAFT_FILE: str(draft)}, timeout=2, leftovers=tmp_path / "left.json")
    (tmp_path / "plugin.json").write_text(json.dumps(conf))
    plugin_dir = tmp_path / "plugin"
    plugin_dir.mkdir()
    (plugin_dir / f"{upstream.PLUGIN}.py").write_text(
        (Path(upstream.__file__).with_name("upstream_plugin.py")).read_text())
    env = dict(os.environ, PYTHONPATH=str(plugin_dir), PATCHKIT_UPSTREAM_CONFIG=str(tmp_path / "plugin.json"),
               PATCHKIT_UPSTREAM_RUN="fake-run", PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTEST_ADDOPTS", None)
    junit = tmp_path / "junit.xml"
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", upstream.PLUGIN, "-p", "no:cacheprovider", "-q",
                          f"--junitxml={junit}", "-o", "junit_family=xunit2"], cwd=tests, env=env,
                         capture_output=True, text=True, timeout=120)
    got = {o.id.split("::")[1]: o for o in upstream.parse_junit(junit.read_text())}
    assert {k: o.outcome for k, o in got.items()} == {
        "test_text_preset_is_local": "passed", "test_module_level_server_too": "passed",
        "test_embedding_not_run": "skipped", "test_unknown_preset_not_run": "skipped",
        "test_own_hf_model_not_run": "skipped", "test_draft_mapped": "passed", "test_other_download_not_run": "skipped",
        "test_slow": "skipped", "test_hangs": "failed"}, res.stdout[-3000:]
    assert got["test_embedding_not_run"].message == "patchkit: not run: embedding preset: no local model"
    assert got["test_unknown_preset_not_run"].message == (
        "patchkit: not run: preset brand_new_preset: patchkit knows no local stand-in for it")
    assert got["test_own_hf_model_not_run"].message == ("patchkit: not run: the test asks for the Hugging Face model "
                                                         "bartowski/Phi-3.5-mini-instruct-GGUF:Q4_K_M itself "
                                                         "(offline: no stand-in)")
    assert got["test_other_download_not_run"].message == (
        "patchkit: not run: needs moe_shakespeare15M.gguf from the network (no local stand-in)")
    assert got["test_slow"].message.startswith("patchkit: not run: marked slow")
    assert "per-test timeout: the test's call ran longer than 2 s" in got["test_hangs"].message
    assert json.loads((tmp_path / "left.json").read_text()) == []


def test_report_names_the_regression_with_its_message():
    before = (_o("a", "passed"), _o("b", "passed"), _o("e", "skipped", "patchkit: not run: vision preset"))
    after = (_o("a", "passed"), _o("b", "failed", "assert 'What is' == 'What is ?'"),
             _o("e", "skipped", "patchkit: not run: vision preset"))
    runs = tuple(upstream.SideRun(side, "c" * 40, "/bin/llama-server", outs, 5.0, 1, "j.xml", "p.log", ())
                 for side, outs in (("base", before), ("candidate", after)))
    res = upstream.Result("/r", "a" * 40, "b" * 40, "harmful", "b" * 40, ("unit/test_tokenize.py",), "tiny", (),
                          "/venv", runs, upstream.compare([before], [after]), asked=("ci",))
    data = upstream.to_json(res)
    assert data["ok"] is False and data["tests"] == ["ci"]
    assert data["counts"] == {"run": 2, "passed_before": 2, "passed_after": 1, "regressions": 1, "gained": 0,
                              "not_judged": 0, "not_run": 1, "flaky": 0}
    assert data["regressions"] == [{"id": "b", "message": "assert 'What is' == 'What is ?'"}]
    assert data["not_run_reasons"] == {"vision preset": 1}
    text = upstream.text_summary(res)
    assert "REGRESSION: b: assert 'What is' == 'What is ?'" in text
    assert "not run (1): vision preset" in text
    json.dumps(data)  # serialisable as written to upstream.json
