"""The CLI surface: help that teaches, distinct exit codes. No processes."""
import pytest
from click.testing import CliRunner

from toolkit import errors
from toolkit.cli import cli


@pytest.mark.parametrize("cmd", [[], ["source", "fetch"], ["model"], ["build"], ["apply"], ["check"], ["verify"],
                                 ["demo"], ["pin"], ["repro"], ["ci"], ["report", "merge"]])
def test_help_has_an_example(cmd):
    res = CliRunner().invoke(cli, cmd + ["--help"])
    assert res.exit_code == 0, res.output
    if cmd and cmd != ["source", "fetch"] and cmd != ["model"]:
        assert "patchkit " in res.output.split("Options:")[0]


def test_exit_codes_are_distinct():
    classes = [errors.UsageError, errors.RepoError, errors.LayoutError, errors.PatchError, errors.BuildError,
               errors.ServerError, errors.EnvironmentProblem, errors.ReportError, errors.Interrupted]
    codes = [c.exit_code for c in classes]
    assert len(set(codes)) == len(codes)
    assert not {0, 1} & set(codes)
    res = CliRunner().invoke(cli, ["exit-codes"])
    for c in codes:
        assert f"{c:4d}" in res.output


def test_fail_fast_without_a_candidate_is_refused_before_anything():
    res = CliRunner().invoke(cli, ["verify", "--baseline-only", "--fail-fast"])
    assert isinstance(res.exception, errors.UsageError), res.output
    assert "no candidate can fail; drop --fail-fast" in str(res.exception)


def test_a_build_error_gives_its_whole_log_or_its_message(tmp_path):
    """What the schemata read for their stillborn mutants: every compiler error, in the kept log."""
    log = tmp_path / "build.log"
    log.write_text("a.cpp:1:1: error: one\nb.cpp:2:2: error: two\n")
    assert errors.BuildError("compile failed: a.cpp:1:1: error: one", log=str(log)).output() == log.read_text()
    assert errors.BuildError("cmake configure failed").output() == "cmake configure failed"


def test_gate_inputs_are_refused_before_anything(tmp_path):
    import json
    evil = tmp_path / "pr-set.json"
    evil.write_text(json.dumps({"prs": ["https://github.com/evil/llama.cpp/pull/1/commits/" + "a" * 40]}))
    # (main() turns these exceptions into their exit codes; CliRunner shows the exception)
    res = CliRunner().invoke(cli, ["ci", "--plan", "--pr-set", str(evil)])
    assert isinstance(res.exception, errors.UsageError) and "owner 'evil' is not allowed" in str(res.exception)
    res = CliRunner().invoke(cli, ["ci", "--plan"])
    assert isinstance(res.exception, errors.UsageError) and "give --pr-set" in str(res.exception)
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps({"prs": ["https://github.com/ggml-org/llama.cpp/pull/1/commits/" + "a" * 40]}))
    res = CliRunner().invoke(cli, ["ci", "--plan", "--pr-set", str(ok), "--workload", "overflow-4,nope"])
    assert isinstance(res.exception, errors.UsageError)
    res = CliRunner().invoke(cli, ["ci", "--plan", "--pr-set", str(ok), "--workload", "overflow-4,fits"])
    plan = json.loads(res.output)
    assert res.exit_code == 0 and [m["workloads"] for m in plan["include"]] == ["overflow-4", "fits"]
    assert plan["pins"] == [{"owner": "ggml-org", "pr": 1, "sha": "a" * 40}]


def test_report_merge_without_gate_json_is_a_report_error(tmp_path):
    res = CliRunner().invoke(cli, ["report", "merge", str(tmp_path)])
    assert isinstance(res.exception, errors.ReportError) and "not a readable gate.json" in str(res.exception)


def test_ci_plan_gets_a_shard_per_repeat_a_sanitizer_shard_and_an_upstream_shard(tmp_path):
    import json
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps({"prs": ["https://github.com/myfork/llama.cpp/pull/7/commits/" + "b" * 40]}))
    res = CliRunner().invoke(cli, ["ci", "--plan", "--pr-set", str(ok), "--workload", "overflow-4", "--repeat", "2",
                                   "--owner", "myfork", "--sanitize", "address,undefined", "--upstream-tests", "ci"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.output)
    assert [m["name"] for m in plan["include"]] == ["overflow-4 #1", "overflow-4 #2", "sanitize address,undefined",
                                                    "upstream tests ci"]
    assert plan["include"][2]["sanitize"] == "address,undefined" and plan["include"][3]["upstream"] == "ci"
    assert plan["pins"] == [{"owner": "myfork", "pr": 7, "sha": "b" * 40}]
    # without --owner the same file is refused: the option is what allowed it
    res = CliRunner().invoke(cli, ["ci", "--plan", "--pr-set", str(ok)])
    assert isinstance(res.exception, errors.UsageError) and "owner 'myfork' is not allowed" in str(res.exception)


def test_mutants_list_prints_the_catalog_of_the_named_patch():
    from toolkit import mutate
    res = CliRunner().invoke(cli, ["mutants", "--list", "--patch", "park-slot"])
    assert res.exit_code == 0, res.output
    names = [line.split()[0] for line in res.output.splitlines()]
    assert names == list(mutate.catalog("park-slot")) and names
    res = CliRunner().invoke(cli, ["mutants", "--list"])
    assert [line.split()[0] for line in res.output.splitlines()] == list(mutate.catalog())


def test_the_group_options_version_and_verbose():
    from importlib.metadata import version
    res = CliRunner().invoke(cli, ["--version"])
    assert res.exit_code == 0 and version("patchkit") in res.output
    res = CliRunner().invoke(cli, ["-v", "exit-codes"])
    assert res.exit_code == 0 and "130" in res.output


@pytest.mark.parametrize("cmd", [["verify"], ["repro", "--out", "x.sh"]])
def test_the_candidate_options_are_one_definition(cmd):
    """verify and repro take a candidate through the same decorator (cli_options.candidate_options):
    the same flags, under the library's names, refused the same way when two are given."""
    from click.testing import CliRunner

    from toolkit import cli_options
    from toolkit.cli import cli

    command = cli.get_command(None, cmd[0])
    names = {p.name for p in command.params}
    assert {"candidate_ref", "patch_name", "patch_file", "commit"} <= names
    r = CliRunner().invoke(cli, [*cmd, "--repo", ".", "--candidate", "a", "--commit", "b"], standalone_mode=False)
    assert isinstance(r.exception, cli_options.UsageError)
    assert str(r.exception) == "give at most one of --candidate, --patch, --patch-file, --commit."


def test_mutants_merge_joins_the_shards_of_one_campaign_and_refuses_others(tmp_path):
    """`mutants --merge`: pure data, no build. The shards' operators.json (as `--operators --shard K/N`
    writes them) join into one table; shards of another schema are refused with exit 2."""
    import json

    from click.testing import CliRunner

    from toolkit.cli import cli

    def mutant(i, status):
        return {"id": i, "line": 10 + i, "operator": "ROR", "original": "<", "mutated": "<=", "context": f"x{i}",
                "status": status, "check": "integrity" if status == "killed" else "", "where": "overflow-4 run 1",
                "reason": "r", "seconds": 1.0}

    def shard(name, schema, mutants):
        d = tmp_path / name
        d.mkdir()
        (d / "operators.json").write_text(json.dumps({
            "base": "b" * 40, "schema_commit": "c" * 40, "schema_tree": schema, "generated": 4, "duplicates": 0, "stillborn": [],
            "killed": 0, "alive": 0, "schema_build_s": 20.0, "seconds": 30.0 + len(mutants), "mutants": mutants}))
        return str(d)

    a = shard("s1", "s" * 40, [mutant(1, "killed"), mutant(3, "killed")])
    b = shard("s2", "s" * 40, [mutant(2, "killed"), mutant(4, "ALIVE")])
    r = CliRunner().invoke(cli, ["mutants", "--merge", a, "--merge", b, "--report-dir", str(tmp_path / "all"), "--json"])
    doc = json.loads(r.output)
    assert r.exit_code == 1 and [m["id"] for m in doc["mutants"]] == [1, 2, 3, 4]   # one ALIVE: exit 1
    assert (doc["killed"], doc["alive"], doc["seconds"]) == (3, 1, 32.0)            # the longest shard's time
    assert json.loads((tmp_path / "all" / "operators.json").read_text()) == doc
    other = shard("s3", "t" * 40, [mutant(5, "killed")])
    r = CliRunner().invoke(cli, ["mutants", "--merge", a, "--merge", other], standalone_mode=False)
    assert "not shards of one campaign" in str(r.exception)


def test_stop_all_sweeps_again_for_a_child_caught_mid_exec(monkeypatch):
    """A child inside execve has no readable environment for an instant: the first sweep misses
    it. stop_all sweeps until two passes in a row find nothing, so it is killed on the next one
    (no process is started: /proc and kill are stood in for)."""
    from toolkit import proc
    passes = iter([[], [4242], [], []])
    killed = []
    monkeypatch.setattr(proc, "marked", lambda value: next(passes, []))
    monkeypatch.setattr(proc.os, "kill", lambda pid, sig: killed.append((pid, sig)))
    proc.stop_all()
    assert killed == [(4242, proc.signal.SIGKILL)]
    # a single sweep (the old rule) would have stopped after the first, empty pass
    assert next(passes, "done") == "done"
