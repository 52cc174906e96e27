"""The benchmark scripts' own logic and entry points (they print figures; these check what they
print from given measurements): bench/first_run.py's build table (issue 37, "measure first": read
from a workspace's .ninja_log, a step over a second compiled, a shorter one replayed by ccache)
and its --builds, bench/log_quiet.py's table."""
import importlib.util
import sys
from pathlib import Path

from toolkit import runner

BENCH = Path(__file__).parents[2] / "bench"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_build_table_counts_compiles_hits_and_the_patched_tu(tmp_path):
    log = tmp_path / "work" / "abcd-flags" / "build" / ".ninja_log"
    log.parent.mkdir(parents=True)
    log.write_text("# ninja log v5\n"
                   "0\t45000\t1\tcommon/CMakeFiles/llama-common.dir/arg.cpp.o\tx\n"
                   "0\t30000\t1\ttools/server/CMakeFiles/server-context.dir/server-context.cpp.o\tx\n"
                   "0\t20\t1\ttools/server/CMakeFiles/server-context.dir/server-context.cpp.o\tx\n"
                   "0\t25000\t1\ttools/server/CMakeFiles/server-context.dir/server-context.cpp.o\tx\n"
                   "0\t900\t1\tbin/llama-server\tx\n")          # a link: not a TU
    head, row = _load("first_run").builds(tmp_path)
    assert head.endswith("3 compiled (100 s summed), 1 replayed, the patched TU compiled 2x"), head
    assert row.startswith("  abcd-flags: 3 compiled") and "longest: arg.cpp 45 s, server-context.cpp 30 s" in row
    assert _load("first_run").builds(tmp_path / "empty") == [f"builds: no workspace under {tmp_path / 'empty' / 'work'}"]


def test_first_run_builds_option_prints_the_build_table_and_stops(tmp_path, monkeypatch, capsys):
    log = tmp_path / "work" / "abcd-flags" / "build" / ".ninja_log"
    log.parent.mkdir(parents=True)
    log.write_text("# ninja log v5\n0\t45000\t1\tcommon/CMakeFiles/llama-common.dir/arg.cpp.o\tx\n")
    monkeypatch.setattr(sys, "argv", ["first_run.py", "--builds", str(tmp_path)])
    assert _load("first_run").main() == 0
    out = capsys.readouterr().out
    assert out.startswith("builds: 1 workspace(s)") and "abcd-flags: 1 compiled (45 s summed)" in out, out
    assert "fresh HOME" not in out          # nothing cloned, nothing run


def test_log_quiet_table_names_each_workloads_most_and_the_family_that_showed_it():
    mb = 2**20
    rows = _load("log_quiet").table([("overflow-4", 3 * mb, mb // 2, "evict-largest-slot"),
                                     ("overflow-4", 4 * mb, mb // 4, "park-slot"),
                                     ("traffic rude-clients", 10 * mb, 0, "park-slot")])
    assert rows[1].split() == ["overflow-4", "4.0", "MB", "0.50", "MB", "(evict-largest-slot)"], rows
    assert rows[2].split() == ["traffic", "rude-clients", "10.0", "MB", "0.00", "MB", "(park-slot)"], rows
    assert rows[-1] == f"most: 0.50 MB; runner.QUIET_CAP is {runner.QUIET_CAP >> 20} MB (32x)", rows
    assert _load("log_quiet").table([]) == [rows[0], "no run measured"]
    assert _load("log_quiet").table([("w", mb, 0, "f")])[-1] == f"most: 0 MB; runner.QUIET_CAP is {runner.QUIET_CAP >> 20} MB"
