"""PATCHKIT_SHARED_RUNS: a job's reference runs (base, control) measured once per what makes them
the same measurement, read back by every later comparison; nothing shared without it."""
import os
import shutil
from dataclasses import replace
from pathlib import Path

from toolkit import runner, workload
from toolkit.record import Run


def _made(calls: list, wall: float = 0.5):
    def make() -> Run:
        calls.append(1)
        return Run("overflow-4", (), (), (), True, None, wall + len(calls), f"made-{len(calls)}.log")
    return make


def test_a_reference_run_is_made_once_per_binary_model_workload_index_and_policy(tmp_path, monkeypatch):
    binary, model = tmp_path / "llama-server", tmp_path / "m.gguf"
    binary.write_bytes(b"server one")
    model.write_bytes(b"model")
    wl = workload.load("overflow-4")
    calls: list = []

    monkeypatch.delenv(runner.SHARED_ENV, raising=False)
    for _ in range(2):
        assert runner.shared("base", binary, model, wl, 0, "largest", _made(calls))[1] is False
    assert len(calls) == 2, "without the variable every run is made"

    monkeypatch.setenv(runner.SHARED_ENV, str(tmp_path / "shared"))
    calls.clear()
    first, kept = runner.shared("base", binary, model, wl, 0, "largest", _made(calls))
    again, kept_again = runner.shared("base", binary, model, wl, 0, "largest", _made(calls))
    assert (kept, kept_again, len(calls)) == (False, True, 1) and again == first
    # each of these is another measurement, so it is made
    runner.shared("control", binary, model, wl, 0, "largest", _made(calls))       # another kind
    runner.shared("base", binary, model, wl, 1, "largest", _made(calls))          # the next repeat
    runner.shared("base", binary, model, wl, 0, "smallest", _made(calls))         # starts shaped for another victim
    runner.shared("base", binary, model, workload.load("overflow-8"), 0, "largest", _made(calls))
    monkeypatch.setenv("PATCHKIT_ATTEMPTS", "1")
    runner.shared("base", binary, model, wl, 0, "largest", _made(calls))          # a start cap
    monkeypatch.delenv("PATCHKIT_ATTEMPTS")
    assert len(calls) == 6
    binary.write_bytes(b"server two, rebuilt in place")                           # the same path, other bytes
    os.utime(binary, ns=(1, 1))
    assert runner.shared("base", binary, model, wl, 0, "largest", _made(calls))[1] is False
    assert len(calls) == 7
    ledger = [line.split() for line in (tmp_path / "shared" / "ledger").read_text().splitlines()]
    assert [u[:5] for u in ledger[:2]] == [["made", "base", "overflow-4", "0", "1.500"],
                                          ["read", "base", "overflow-4", "0", "1.500"]], ledger
    assert ledger[0][5] == ledger[1][5] and len({u[5] for u in ledger}) == 7 == sum(u[0] == "made" for u in ledger)
    # a candidate's run is never read back, only written down under its key (its environment and flags in it)
    run = Run("overflow-4", (), (), (), True, None, 0.25, "c.log")
    for extra in ((), (), (("MUTANT", "3"),)):
        runner.made("candidate", binary, model, wl, 0, "largest", run, extra)
    cands = [u for u in (line.split() for line in (tmp_path / "shared" / "ledger").read_text().splitlines())
             if u[1] == "candidate"]
    assert [u[0] for u in cands] == ["made"] * 3 and cands[0][5] == cands[1][5] != cands[2][5]
    assert runner.ledger_summary(str(tmp_path / "shared")) == (
        "runs shared by this session: 7 reference runs made, 1 read back; 3 candidate runs made, "
        "1 of them the same key as an earlier one")
    assert runner.ledger_summary(str(tmp_path / "none")) is None and runner.ledger_summary("") is None


def test_a_shared_runs_logs_are_kept_beside_it_so_every_report_names_a_log_that_exists(tmp_path, monkeypatch):
    """The first comparison's directory (a test's tmp_path) goes when it passes; the run read back
    by later ones names its log, and each earlier start's, in the job's directory, while the first
    directory keeps its own logs (a test reads them there)."""
    binary, model = tmp_path / "llama-server", tmp_path / "m.gguf"
    binary.write_bytes(b"server")
    model.write_bytes(b"model")
    first = tmp_path / "first"
    first.mkdir()
    (first / "base.log").write_text("the run's log")
    (first / "base.start1.log").write_text("an earlier start's log")
    earlier = Run("overflow-4", (), (), (), True, None, 0.1, str(first / "base.start1.log"))
    run = replace(Run("overflow-4", (), (), (), True, None, 0.2, str(first / "base.log")), earlier=(earlier,))
    monkeypatch.setenv(runner.SHARED_ENV, str(tmp_path / "shared"))
    made, _ = runner.shared("base", binary, model, workload.load("overflow-4"), 0, "largest", lambda: run)
    read, kept = runner.shared("base", binary, model, workload.load("overflow-4"), 0, "largest", lambda: 1 / 0)
    assert kept and read == made and (first / "base.log").read_text() == "the run's log"
    shutil.rmtree(first)
    assert Path(read.log).parent == tmp_path / "shared" and Path(read.log).read_text() == "the run's log"
    assert Path(read.earlier[0].log).read_text() == "an earlier start's log" != read.log
    # the next run at a kept log's path writes a new file: the kept one keeps its text
    again = tmp_path / "again"
    again.mkdir()
    (again / "base.log").write_text("run one")
    kept_one = runner._logs_kept(replace(run, log=str(again / "base.log"), earlier=()), tmp_path / "shared", "k")
    runner.fresh_log(again / "base.log")
    (again / "base.log").write_text("run two")
    assert Path(kept_one.log).read_text() == "run one"


def test_every_real_file_has_its_place_in_the_longest_first_order():
    """A real file left out of tests/conftest.py's LONG_FIRST runs after all of them: a long one
    added there would run alone at the tail of every CI run."""
    from pathlib import Path

    from tests import conftest
    real = {p.name for p in (Path(__file__).parent.parent / "real").glob("test_*.py")}
    assert real == set(conftest.LONG_FIRST), (real ^ set(conftest.LONG_FIRST))
