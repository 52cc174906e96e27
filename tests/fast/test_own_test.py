"""The series' own upstream-style test (issue 36): rendered per tree and per family, valid Python
in upstream's idiom, asserting the family's promise."""
from toolkit import export

UTILS_C2 = "class ServerProcess:\n    n_ctx: int | None = None\n    kv_unified: bool | None = False\n"
UTILS_OLD = "class ServerProcess:\n    n_ctx: int | None = None\n"
ARG_OLD = '''add_opt(common_arg(
        {"--kv-unified", "-kvu"},
        "use single unified KV buffer",
        [](common_params & params) { params.kv_unified = true; }
    ).set_env("LLAMA_ARG_KV_SPLIT"));'''


def test_the_eviction_test_asserts_one_victim_in_upstreams_idiom():
    text = export.render_own_test("one-victim", UTILS_C2, "")
    compile(text, "test_kv_full.py", "exec")
    assert "from utils import *" in text and "ServerPreset.tinyllama2()" in text
    assert "server.kv_unified = True" in text and "monkeypatch" not in text
    assert "def test_full_kv_cache_ends_only_the_largest_request" in text
    assert "== [3], statuses" in text and "Context size has been exceeded" in text


def test_a_preemption_family_asserts_every_request_completes():
    text = export.render_own_test("preemption", UTILS_C2, "")
    compile(text, "test_kv_full.py", "exec")
    assert "def test_full_kv_cache_completes_every_request" in text
    assert "all(res.status_code == 200 for res in results)" in text and "== [3]" not in text


def test_an_older_tree_sets_the_flags_environment_variable():
    text = export.render_own_test("one-victim", UTILS_OLD, ARG_OLD)
    compile(text, "test_kv_full.py", "exec")
    assert "server.kv_unified" not in text
    assert 'monkeypatch.setenv("LLAMA_ARG_KV_SPLIT", "1")' in text
