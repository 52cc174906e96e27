"""A new user's first run (issue 21): the fetch's progress survives pip's temp files vanishing
and never goes quiet, CMake's lines arrive whole and without the git probe's noise, header
generation says what it does, the help keeps workload names whole, the report says whose
error it is and where a slot started, and the chart's labels stay inside it. No processes."""
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from toolkit import build, compare, errors, measure, proc, report, source, workload
from toolkit.cli import cli
from toolkit.record import Outcome

from .sim import EXC, simulate

# a real configure of the C2 tree in a private work tree (build.log), abridged
CONFIGURE = """\
-- The C compiler identification is GNU 12.2.0
-- llama.cpp version: 0.1.0-dev
-- Found Git: /usr/bin/git (found version "2.39.5")
fatal: not a git repository (or any of the parent directories): .git
fatal: not a git repository (or any of the parent directories): .git
-- The ASM compiler identification is GNU
-- ggml commit:  unknown
CMake Warning at common/CMakeLists.txt:33 (message):
  Git repository not found; to enable automatic generation of build info,
  make sure Git is installed and the project is a Git repository.


CMake Warning at ggml/CMakeLists.txt:120 (message):
  GGML_NATIVE is deprecated.


-- Generating embedded license file for target: llama-app
-- Configuring done
-- Build files have been written to: /root/.cache/patchkit/work/5c53582ecbca1ff1-1bf738791e/build
"""


def shown(text: str) -> list[str]:
    lines = build.CMakeLines()
    return [s for line in text.splitlines() for s in lines.feed(line)]


def test_cmake_lines_whole_and_the_git_probe_said_once():
    out = shown(CONFIGURE)
    assert "cmake: -- Build files have been written to: /root/.cache/patchkit/work/5c53582ecbca1ff1-1bf738791e/build" \
        in out, "the line keeps its first letter"
    notes = [s for s in out if "git repository" in s.lower()]
    assert notes == [build.GIT_NOTE] and "harmless" in notes[0] and "build number" in notes[0]
    assert not [s for s in out if "fatal:" in s or "make sure Git is installed" in s
                or s.endswith("common/CMakeLists.txt:33 (message):")], "the probe's own lines are dropped"
    # another warning is shown, header and body
    i = out.index("cmake: CMake Warning at ggml/CMakeLists.txt:120 (message):")
    assert out[i + 1] == "cmake: GGML_NATIVE is deprecated."
    assert "cmake: -- Found Git: /usr/bin/git (found version \"2.39.5\")" in out and "" not in out
    # every configure says it once, not once per process
    assert shown(CONFIGURE).count(build.GIT_NOTE) == 1


def test_cut_keeps_start_and_end_around_an_ellipsis():
    assert build.cut("  short line  ") == "short line"
    long = "-- Build files have been written to: /" + "x" * 300 + "/build"
    c = build.cut(long, 100)
    assert len(c) == 100 and c.startswith("-- Build files") and c.endswith("x/build") and "…" in c


def test_header_generation_says_what_it_does(monkeypatch, tmp_path):
    calls = []

    def run(argv, **kw):  # ninja -t targets, then each header's own command (-t commands -s)
        out = ("cd b && cmake -DINPUT=index.html.gz -P xxd.cmake\n" if "commands" in argv
               else "tools/server/index.html.gz.hpp: CUSTOM_COMMAND\nggml/src/x.o: CXX\n")
        return proc.Result(tuple(argv), 0, out, "", 0.0)
    monkeypatch.setattr(build.proc, "run", run)

    def stream(argv, on_line=None, **kw):
        calls.append(argv)
        for line in ["ninja: Entering directory `b'", "[1/1] Generating index.html.gz.hpp"]:
            on_line(line)
        return proc.Result(tuple(argv), 0, "", "", 0.0)

    monkeypatch.setattr(build.proc, "stream", stream)
    said = []
    build._generate_headers(tmp_path, tmp_path / "log", tmp_path, said.append)
    # the header's own command only, never ggml's objects (Ninja's order-only chain)
    assert calls == [["sh", "-c", "cd b && cmake -DINPUT=index.html.gz -P xxd.cmake"]]
    assert said[0].startswith("generating the server's headers") and "index.html.gz.hpp" in said[0]
    assert "[1/1] Generating index.html.gz.hpp" in said


def test_fetch_progress_survives_vanishing_files(monkeypatch, tmp_path):
    (tmp_path / "pip-unpack-1").mkdir()
    (tmp_path / "pip-unpack-1" / "llama_cpp_python-0.3.35.tar.gz").write_bytes(b"x" * 2_000_000)
    gone = tmp_path / "pip-wheel-2"
    gone.mkdir()
    (gone / "other-1.0.tar.gz").write_bytes(b"y" * 10)
    real_stat = os.stat

    def stat(path, *a, **kw):  # pip removes pip-wheel-2 between the listing and the stat
        if "pip-wheel-2" in str(path):
            shutil.rmtree(gone, ignore_errors=True)
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_stat(path, *a, **kw)

    monkeypatch.setattr(source.os, "stat", stat)
    assert source.archive_bytes(tmp_path) == 2_000_000
    said = []
    watch = source._PipWatch(tmp_path, said.append)
    watch.on_line("  Downloading llama_cpp_python-0.3.35.tar.gz (74.9 MB)")
    assert watch.tick() == "  downloaded 2.0 MB of 74.9 MB" and said == ["  downloaded 2.0 MB of 74.9 MB"]
    # a directory that vanished whole, and a progress callback that fails: still no exception
    shutil.rmtree(tmp_path / "pip-unpack-1")
    assert source.archive_bytes(tmp_path / "pip-unpack-1") == 0

    def boom(msg):
        raise OSError("stderr closed")

    bad = source._PipWatch(tmp_path, boom)
    bad.got = -1
    assert bad.tick() is None


def test_fetch_progress_never_quiet_while_pip_builds_metadata(tmp_path):
    said = []
    watch = source._PipWatch(tmp_path, said.append, quiet=15)
    t0 = watch.start
    watch.on_line("  Installing build dependencies: started")
    assert said == ["  pip: Installing build dependencies"]
    watch.said = t0
    assert watch.tick(t0 + 3) is None  # nothing new, not quiet long enough
    msg = watch.tick(t0 + 16)
    assert msg and msg.startswith("  still waiting for pip (16 s") and "Installing build dependencies" in msg
    assert watch.tick(t0 + 19) is None and watch.tick(t0 + 31)  # and again 15 s later
    # over a whole minute of silence from pip, never more than quiet + one tick between lines
    times = [t0 + 31 + 3 * k for k in range(30) if watch.tick(t0 + 31 + 3 * k)]
    assert times and max(b - a for a, b in zip([t0 + 31] + times, times)) <= 18


@pytest.mark.parametrize("width", [60, 80, 100, 120])
def test_help_keeps_workload_names_whole(width):
    res = CliRunner().invoke(cli, ["verify", "--help"], terminal_width=width)
    assert res.exit_code == 0
    words = set(re.findall(r"[\w-]+", res.output))
    for name in workload.available():
        assert name in words, f"{name} split in --help at {width} columns"
    lines = [line.split() for line in res.output.splitlines()]
    joined = {a[-1] + b[0].rstrip(",.") for a, b in zip(lines, lines[1:]) if a and b and a[-1].endswith("-")}
    assert not joined & set(workload.available()), "a name cut at its hyphen across two lines"


def outcome(slot, error=None):
    return Outcome(slot, "errored" if error else "completed", 200, error, not error, None if error else "limit",
                   None, None, (1, 2), 40, 240, 0.0, 0.1, 0.2, (0.1, 0.2))


def test_error_column_says_whose_error():
    assert report.error_cell(outcome(0, EXC), outcome(0)) == f"base: {EXC}"
    assert report.error_cell(outcome(0), outcome(0, EXC)) == f"candidate: {EXC}"
    assert report.error_cell(outcome(0, EXC), outcome(0, EXC)) == f"both: {EXC}"
    assert report.error_cell(outcome(0, EXC), outcome(0, "boom")) == f"base: {EXC}; candidate: boom"
    assert report.error_cell(outcome(0), outcome(0)) == ""
    assert report.error_cell(outcome(0, EXC), None, has_candidate=False) == EXC


def test_start_offsets_in_words():
    wl = workload.load("overflow-4")
    prompts = [len(r.prompt) for r in wl.requests]
    for verbose in (True, False):  # from the server log, and from /slots snapshots
        run = simulate(prompts, 240, wl.server.ctx, launch=[0, 1, 0, 3], verbose=verbose, snapshots=(5, 10))
        detail = compare.start_shape(measure.measure(run, wl)).detail
        assert detail.startswith("slot 1 started generating 1 step after slot 0; "
                                 "slot 3 started generating 3 steps after slot 0 (released together; measured from ")
        assert "{" not in detail


def test_chart_labels_stay_inside_the_figure():
    wl = workload.load("overflow-8")
    prompts = [len(r.prompt) for r in wl.requests]
    for patched in (False, True):  # the base terminates all eight: the longest label
        fig = report.timeline_figure(simulate(prompts, 240, wl.server.ctx, patched=patched), wl, "overflow-8")
        fig.canvas.draw()
        box = fig.bbox
        texts = [t for t in fig.axes[0].texts if t.get_text().startswith("overflow at off")]
        assert texts
        for t in texts:
            ext = t.get_window_extent()
            assert ext.x0 >= box.x0 and ext.x1 <= box.x1, f"'{t.get_text()}' runs off the chart"


class _Index:
    """A package index on 127.0.0.1 (a thread, no process): a PEP 691 JSON page for one sdist."""

    def __init__(self, body: bytes, listed_sha: str, json_api: bool = True):
        import http.server
        import threading

        idx = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                if self.path == "/simple/pkg/":
                    if not json_api:
                        data, ctype = b"<html>links</html>", "text/html"
                    else:
                        data = json.dumps({"meta": {"api-version": "1.1"}, "files": [
                            {"filename": "pkg-1.0.tar.gz", "url": f"http://127.0.0.1:{idx.port}/f/pkg-1.0.tar.gz",
                             "hashes": {"sha256": listed_sha}}]}).encode()
                        ctype = "application/vnd.pypi.simple.v1+json"
                elif self.path == "/f/pkg-1.0.tar.gz":
                    data, ctype = body, "application/octet-stream"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_fetch_takes_the_sdist_from_the_index_json_api_and_checks_its_sha256(tmp_path, monkeypatch):
    """No pip, so no build backend installed to prepare metadata nobody reads (issue 25: ~40 s
    of a new user's first run). The archive is kept only when its sha256 is the index's."""
    import hashlib

    body = b"an sdist's bytes" * 1000
    with _Index(body, hashlib.sha256(body).hexdigest()) as idx:
        monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{idx.port}/simple/")
        said = []
        got = source._download_direct("pkg", "pkg-1.0.tar.gz", tmp_path, said.append)
        assert got == tmp_path / "pkg-1.0.tar.gz" and got.read_bytes() == body
        assert said[-1].endswith("sha256 verified") and said[0].startswith("downloading pkg-1.0.tar.gz from 127.0.0.1")
        with pytest.raises(source._NoDirect, match="lists no pkg-2.0.tar.gz"):
            source._download_direct("pkg", "pkg-2.0.tar.gz", tmp_path, said.append)
    got.unlink()
    with _Index(body, "0" * 64) as idx:  # the bytes are not what the index lists: refused, nothing kept
        monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{idx.port}/simple")
        with pytest.raises(errors.EnvironmentProblem, match="does not match the sha256 the index lists"):
            source._download_direct("pkg", "pkg-1.0.tar.gz", tmp_path, said.append)
        assert list(tmp_path.iterdir()) == []
    with _Index(body, "0" * 64, json_api=False) as idx:  # an index without the JSON API: pip's turn
        monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{idx.port}/simple")
        with pytest.raises(source._NoDirect, match="HTTP 200, text/html"):
            source._download_direct("pkg", "pkg-1.0.tar.gz", tmp_path, said.append)
    assert list(tmp_path.iterdir()) == []
