"""bench/first_run.py's build table (issue 37, "measure first"): read from a workspace's
.ninja_log, a step over a second compiled, a shorter one was replayed by ccache."""
import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("first_run", Path(__file__).parents[2] / "bench" / "first_run.py")
first_run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(first_run)


def test_the_build_table_counts_compiles_hits_and_the_patched_tu(tmp_path):
    log = tmp_path / "work" / "abcd-flags" / "build" / ".ninja_log"
    log.parent.mkdir(parents=True)
    log.write_text("# ninja log v5\n"
                   "0\t45000\t1\tcommon/CMakeFiles/llama-common.dir/arg.cpp.o\tx\n"
                   "0\t30000\t1\ttools/server/CMakeFiles/server-context.dir/server-context.cpp.o\tx\n"
                   "0\t20\t1\ttools/server/CMakeFiles/server-context.dir/server-context.cpp.o\tx\n"
                   "0\t25000\t1\ttools/server/CMakeFiles/server-context.dir/server-context.cpp.o\tx\n"
                   "0\t900\t1\tbin/llama-server\tx\n")          # a link: not a TU
    head, row = first_run.builds(tmp_path)
    assert head.endswith("3 compiled (100 s summed), 1 replayed, the patched TU compiled 2x"), head
    assert row.startswith("  abcd-flags: 3 compiled") and "longest: arg.cpp 45 s, server-context.cpp 30 s" in row
    assert first_run.builds(tmp_path / "empty") == [f"builds: no workspace under {tmp_path / 'empty' / 'work'}"]
