"""Build options: a scoped sanitizer build is configured as the plain build plus a launcher
(so ccache serves every out-of-scope TU from the plain build), a tree-wide one with the tree's own
LLAMA_SANITIZE_* options. No processes."""
from click.testing import CliRunner

from toolkit import build
from toolkit.cli import cli
from toolkit.errors import UsageError


def test_scoped_sanitizer_build_is_the_plain_build_plus_a_launcher(monkeypatch, tmp_path):
    monkeypatch.setenv("PATCHKIT_CACHE", str(tmp_path))
    plain = build.Options().cmake_flags()
    scoped = build.Options(sanitize=("address", "undefined"), sanitize_only=("tools/server/server-context.cpp",))
    flags = scoped.cmake_flags()
    # every plain flag but the launcher is kept as is: out-of-scope compile commands are identical
    assert [f for f in plain if "LAUNCHER" not in f] == [f for f in flags if "LAUNCHER" not in f and "LINKER" not in f]
    assert not any("LLAMA_SANITIZE" in f for f in flags)
    assert "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address -fsanitize=undefined" in flags
    launcher = build.scoped_launcher(scoped.sanitize, scoped.sanitize_only)
    assert f"-DCMAKE_CXX_COMPILER_LAUNCHER={launcher}" in flags
    text = launcher.read_text()
    assert '*/src/tools/server/server-context.cpp) set -- "$@" -fsanitize=address -fno-omit-frame-pointer ' \
           '-fsanitize=undefined -O1' in text
    # a different scope is a different build (workspace and binary store keyed by the flags)
    other = build.Options(sanitize=("address",), sanitize_only=("tools/server/*",))
    assert len({scoped.key(), other.key(), build.Options(sanitize=("address", "undefined")).key()}) == 3


def test_a_scoped_thread_sanitizer_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("PATCHKIT_CACHE", str(tmp_path))
    try:
        build.Options(sanitize=("thread",), sanitize_only=("tools/server/*",)).cmake_flags()
    except UsageError as e:
        assert "needs every TU instrumented" in str(e)
    else:
        raise AssertionError("a scoped ThreadSanitizer build was configured")


def test_tree_wide_sanitizers_use_the_trees_own_options():
    flags = build.Options(sanitize=("address", "undefined")).cmake_flags()
    assert "-DLLAMA_SANITIZE_ADDRESS=ON" in flags and "-DLLAMA_SANITIZE_UNDEFINED=ON" in flags
    assert not any("EXE_LINKER" in f for f in flags)
    # every TU at -O1, ggml's kernels too (the sanitizers' advice), so no ggml project include
    assert set(build.OPT_FLAGS) <= set(flags) and not any("PROJECT_ggml_INCLUDE" in f for f in flags)


def test_a_plain_build_compiles_ggml_at_O3_and_the_rest_at_O1(monkeypatch, tmp_path):
    """ggml's own project() includes a file that restores CMake's Release flags there; every other
    project's TUs take OPT_FLAGS' -O1 (tests/real/test_foundation.py reads compile_commands.json)."""
    monkeypatch.setenv("PATCHKIT_CACHE", str(tmp_path))
    flags = build.Options().cmake_flags()
    assert set(build.OPT_FLAGS) <= set(flags)
    [include] = [f.split("=", 1)[1] for f in flags if f.startswith("-DCMAKE_PROJECT_ggml_INCLUDE=")]
    text = open(include).read()
    assert 'set(CMAKE_CXX_FLAGS_RELEASE "-O3 -DNDEBUG")' in text and 'set(CMAKE_C_FLAGS_RELEASE "-O3 -DNDEBUG")' in text
    # written once, then the same path and key; a file changed on disk is written back
    assert build.Options().cmake_flags() == flags
    open(include, "w").write("garbage")
    assert build.Options().cmake_flags() == flags and open(include).read() == text


def test_sanitize_only_without_sanitize_is_refused():
    # before anything is fetched (main() turns the exception into exit 2; CliRunner shows it)
    res = CliRunner().invoke(cli, ["build", "--repo", "/nonexistent", "--sanitize-only", "tools/server/*"])
    assert isinstance(res.exception, UsageError) and "give --sanitize too" in str(res.exception)
