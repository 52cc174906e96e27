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

    shown = CliRunner().invoke(cli, ["cache", "show", "--json"])
    kinds = json.loads(shown.output)["kinds"]
    assert kinds["workspaces"] == {"bytes": 7000, "entries": 2} and kinds["binaries"]["bytes"] == 3000
    assert "workspaces" in CliRunner().invoke(cli, ["cache"]).output      # the group alone shows

    with open(held.with_name(held.name + ".lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        res = CliRunner().invoke(cli, ["cache", "prune", "--max-gb", "0.000009", "--json"])
    removed = {os.path.basename(r["path"]) for r in json.loads(res.output)["removed"]}
    # total 15000 > 9000: the oldest unheld entries go first, until the cap holds
    assert removed == {"aaaa-opts", "cccc-opts"}, res.output
    assert not old.exists() and not binary.exists() and held.exists() and fresh.exists() and tree.exists()
    # --all-ages: the fresh binary too (the held workspace is free now)
    res = CliRunner().invoke(cli, ["cache", "prune", "--max-gb", "0", "--all-ages"])
    assert "2 entries removed" in res.output and tree.exists() and not fresh.exists() and not held.exists()


def test_a_cache_entry_is_written_whole_with_no_temporary_left(tmp_path):
    """cache.write_atomic: what facts, a server's --help, a launcher and a sensitivity use."""
    from toolkit import cache
    path = tmp_path / "entry.sh"
    path.write_text("old")
    cache.write_atomic(path, "#!/bin/sh\nexit 0\n", mode=0o755)
    assert path.read_text() == "#!/bin/sh\nexit 0\n" and os.access(path, os.X_OK)
    assert [p.name for p in tmp_path.iterdir()] == ["entry.sh"]     # the temporary was renamed, not copied
