"""`patchkit cache`: sizes per kind, and pruning the least recently used entries down to a cap,
never one another patchkit process holds nor one used in the last hour (issue 37). On a private
PATCHKIT_CACHE with entries of known sizes and ages; no builds."""
import fcntl
import json
import os
import time

from click.testing import CliRunner

from toolkit.cli import cli


def _entry(root, folder, name, size, age_s):
    d = root / folder / name
    d.mkdir(parents=True)
    (d / "blob").write_bytes(b"x" * size)
    t = time.time() - age_s
    os.utime(d, (t, t))
    return d


def test_show_and_prune_by_age_size_and_lock(tmp_path, monkeypatch):
    monkeypatch.setenv("PATCHKIT_CACHE", str(tmp_path))
    old = _entry(tmp_path, "work", "aaaa-opts", 4000, 7200)          # least recently used
    held = _entry(tmp_path, "work", "bbbb-opts", 3000, 7000)         # another process builds in it
    binary = _entry(tmp_path, "bins", "cccc-opts", 2000, 5000)
    fresh = _entry(tmp_path, "bins", "dddd-opts", 1000, 10)          # used a moment ago
    tree = _entry(tmp_path, "trees", "llama-cpp-python-0.3.35", 5000, 99999)   # never pruned
    venv = _entry(tmp_path, "upstream", "venvs", 10, 99999)                   # never pruned
    help_ = _entry(tmp_path, "help", "eeee.txt", 500, 4000)                    # a server's --help: one run
    schema = _entry(tmp_path, "schemata", "ffff.json", 10, 3900)              # a catalog's schema: one parse
    (tmp_path / "locks").mkdir()                                              # patchkit's own, not "other"

    shown = CliRunner().invoke(cli, ["cache", "show", "--json"])
    kinds = json.loads(shown.output)["kinds"]
    assert kinds["workspaces"] == {"bytes": 7000, "entries": 2} and kinds["binaries"]["bytes"] == 3000
    # every folder patchkit writes is named by its kind, none left to "other"
    assert kinds["server help"]["bytes"] == 500 and kinds["upstream tests"]["bytes"] == 10
    assert kinds["variant schemata"] == {"bytes": 10, "entries": 1}
    assert kinds["other"] == {"bytes": 0, "entries": 0}
    assert "workspaces" in CliRunner().invoke(cli, ["cache"]).output      # the group alone shows

    with open(held.with_name(held.name + ".lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        res = CliRunner().invoke(cli, ["cache", "prune", "--max-gb", "0.0000096", "--json"])
    removed = {os.path.basename(r["path"]) for r in json.loads(res.output)["removed"]}
    # total 15520 > 9600: the oldest unheld entries go first (the help entry is next), until the cap holds
    assert removed == {"aaaa-opts", "cccc-opts"}, res.output
    assert not old.exists() and not binary.exists() and held.exists() and fresh.exists() and tree.exists()
    # --all-ages: the fresh binary and the help entry too (the held workspace is free now)
    res = CliRunner().invoke(cli, ["cache", "prune", "--max-gb", "0", "--all-ages"])
    assert "4 entries removed" in res.output, res.output
    assert tree.exists() and venv.exists() and not fresh.exists() and not held.exists() and not help_.exists()
    assert not schema.exists()


def test_a_cache_entry_is_written_whole_with_no_temporary_left(tmp_path):
    """cache.write_atomic: what facts, a server's --help, a launcher and a sensitivity use."""
    from toolkit import cache
    path = tmp_path / "entry.sh"
    path.write_text("old")
    cache.write_atomic(path, "#!/bin/sh\nexit 0\n", mode=0o755)
    assert path.read_text() == "#!/bin/sh\nexit 0\n" and os.access(path, os.X_OK)
    assert [p.name for p in tmp_path.iterdir()] == ["entry.sh"]     # the temporary was renamed, not copied


def test_a_kept_document_is_made_once_read_back_marked_used_and_none_keeps_nothing(tmp_path, monkeypatch):
    """cache.kept: the one helper the catalog schema, the operator schema and their TCE share."""
    from toolkit import cache
    monkeypatch.setenv("PATCHKIT_CACHE", str(tmp_path))
    made = []

    def make():
        made.append(1)
        return {"ids": {"a": 1}, "t": (1, 2)}

    assert cache.kept("k1", make) == ({"ids": {"a": 1}, "t": [1, 2]}, False)   # JSON's types on both paths
    entry = tmp_path / "schemata" / "k1.json"
    t = time.time() - 7200
    os.utime(entry, (t, t))
    assert cache.kept("k1", make) == ({"ids": {"a": 1}, "t": [1, 2]}, True)
    assert len(made) == 1                                   # read back: not made again
    assert time.time() - entry.stat().st_mtime < 60         # and marked used, so prune keeps it
    assert cache.kept("k2", lambda: None) == (None, False)
    assert not (tmp_path / "schemata" / "k2.json").exists()
    assert cache.kept("k2", make) == ({"ids": {"a": 1}, "t": [1, 2]}, False)   # a None was not kept
