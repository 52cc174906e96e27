"""pytest plugin for llama.cpp's own server tests (tools/server/tests), offline. Loaded by
`toolkit/upstream.py` as `-p toolkit_upstream_plugin` (this file, copied under that name next to
the run): it runs inside the suite's own venv, so it imports nothing of patchkit.

The tree's tests are never edited. At pytest_configure (after the tree's conftest.py imported
its `utils`, before any test module is collected) the plugin patches, in place, the classes the
test modules import with `from utils import *`:

  - `ServerPreset.<preset>`: the preset's server with a local model file instead of its Hugging
    Face repo (`model_file` set, `model_hf_repo`/`model_hf_file` cleared), or, for a preset with
    no local stand-in, a server whose start() skips the test with the reason;
  - `ServerPreset.load_all`: checks the local files exist instead of downloading every preset;
  - `ServerProcess.start`: skips a test that asks for a remote model itself (`model_hf_repo`,
    `model_url` set after the preset), binds only loopback addresses, and takes a free port per
    start (the suite hard-codes 8080-8085; another job on the machine may hold them);
  - `utils.download_file`: known URLs map to local files (the speculative draft); any other URL
    skips the test (no network).

It also skips tests marked `slow` (upstream's tests.sh runs `-m "not slow"`), fails a test phase
that runs longer than the per-test timeout, and after each test records (and kills) any
llama-server of this run still alive: the suite's autouse teardown should have stopped it.

Configuration: the JSON file named by PATCHKIT_UPSTREAM_CONFIG; the run marker
PATCHKIT_UPSTREAM_RUN is in every server's environment (the suite passes os.environ on).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time

import pytest

PREFIX = "patchkit: not run: "
LOOPBACK = {"127.0.0.1", "::1", "localhost"}

_cfg: dict = {}
_leftovers: list[dict] = []


class UpstreamTimeout(BaseException):
    """A BaseException, so the suite's own `except Exception` polling loops cannot swallow it;
    pytest still reports it as the phase's failure."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _marked_servers() -> list[int]:
    """llama-server processes (routers' children too) carrying this run's marker."""
    marker = os.environ.get("PATCHKIT_UPSTREAM_RUN", "")
    if not marker:
        return []
    want = f"PATCHKIT_UPSTREAM_RUN={marker}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/comm", "rb") as fh:
                if not fh.read().startswith(b"llama-server"):
                    continue
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if want in fh.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            continue
    return found


def _patch(utils) -> None:
    presets = _cfg.get("presets", {})
    urls = _cfg.get("urls", {})
    Preset, Process = utils.ServerPreset, utils.ServerProcess

    def wrap(name, original):
        conf = presets.get(name)
        if conf is None:
            conf = {"not_run": f"preset {name}: patchkit knows no local stand-in for it"}

        def make():
            server = original()
            if "not_run" in conf:
                server._pk_not_run = f"{PREFIX}{conf['not_run']}"
                return server
            if conf.get("model"):
                server.model_file = conf["model"]
                server.model_hf_repo = None
                server.model_hf_file = None
                server.model_url = None
            server._pk_preset = name
            return server
        make.__name__ = name
        return staticmethod(make)

    for name, value in list(vars(Preset).items()):
        if name.startswith("_") or name == "load_all" or not callable(value):
            continue
        original = value.__func__ if isinstance(value, staticmethod) else value
        setattr(Preset, name, wrap(name, original))

    def load_all() -> None:
        for name, conf in presets.items():
            for key in ("model", "draft"):
                path = conf.get(key)
                if path and not os.path.isfile(path):
                    raise RuntimeError(f"patchkit: local model for preset {name} is missing: {path}")
    Preset.load_all = staticmethod(load_all)

    original_start = Process.start

    def start(self, *args, **kwargs):
        why = getattr(self, "_pk_not_run", None)
        if why:
            pytest.skip(why)
        remote = self.model_url or (self.model_hf_repo and " ".join(filter(None, (self.model_hf_repo,
                                                                                 self.model_hf_file))))
        if remote:
            pytest.skip(f"{PREFIX}the test asks for the Hugging Face model {remote} itself (offline: no stand-in)")
        hosts = [h.strip() for h in str(self.server_host).split(",")]
        if not all(h in LOOPBACK for h in hosts):
            self.server_host = "127.0.0.1"
        self.server_port = _free_port()
        # GCP compat mode listens on AIP_HTTP_PORT (default 8080, the suite's old default port;
        # D's utils passes it, C2's relied on the coincidence): tell it the port we chose
        saved = os.environ.get("AIP_HTTP_PORT")
        os.environ["AIP_HTTP_PORT"] = str(self.server_port)
        try:
            return original_start(self, *args, **kwargs)
        finally:
            if saved is None:
                os.environ.pop("AIP_HTTP_PORT", None)
            else:
                os.environ["AIP_HTTP_PORT"] = saved
    Process.start = start

    original_download = utils.download_file

    def download_file(url: str, output_file_path: str | None = None) -> str:
        local = urls.get(url) or urls.get(url.rsplit("/", 1)[-1])   # by URL, or by file name
        if local:
            return local
        pytest.skip(f"{PREFIX}needs {url.rsplit('/', 1)[-1]} from the network (no local stand-in)",
                    allow_module_level=True)
        return original_download(url, output_file_path)  # not reached
    utils.download_file = download_file


def pytest_configure(config) -> None:
    path = os.environ.get("PATCHKIT_UPSTREAM_CONFIG")
    if not path:
        return
    with open(path) as fh:
        _cfg.update(json.load(fh))
    utils = sys.modules.get("utils")
    if utils is None:
        sys.path.insert(0, os.getcwd())
        import utils  # noqa: F401  (the tree's tools/server/tests/utils.py)
    _patch(utils)


def pytest_collection_modifyitems(config, items) -> None:
    if not _cfg or _cfg.get("slow"):
        return
    skip = pytest.mark.skip(reason=f"{PREFIX}marked slow (upstream's tests.sh runs -m 'not slow')")
    for item in items:
        if item.get_closest_marker("slow"):
            item.add_marker(skip)


def _alarm(phase: str):
    seconds = int(_cfg.get("timeout", 0) or 0)

    def fire(signum, frame):
        raise UpstreamTimeout(f"patchkit: per-test timeout: the test's {phase} ran longer than {seconds} s")
    return seconds, fire


def _timed(phase: str):
    @pytest.hookimpl(hookwrapper=True)
    def hook(item):
        seconds, fire = _alarm(phase)
        if seconds:
            previous = signal.signal(signal.SIGALRM, fire)
            signal.alarm(seconds)
        try:
            yield
        finally:
            if seconds:
                signal.alarm(0)
                signal.signal(signal.SIGALRM, previous)
    return hook


pytest_runtest_setup = _timed("setup")
pytest_runtest_call = _timed("call")
pytest_runtest_teardown = _timed("teardown")


@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid, location) -> None:
    """After every test's teardown: a llama-server of this run still alive outlived its test."""
    if not _cfg:
        return
    left = _marked_servers()
    grace = time.monotonic() + 3  # a router's children may still be exiting
    while left and time.monotonic() < grace:
        time.sleep(0.1)
        left = _marked_servers()
    if not left:
        return
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while _marked_servers() and time.monotonic() < deadline:
        time.sleep(0.05)
    _leftovers.append({"test": nodeid, "pids": left})


def pytest_sessionfinish(session, exitstatus) -> None:
    utils = sys.modules.get("utils")
    for server in list(getattr(utils, "server_instances", ()) or ()):
        try:
            server.stop()
        except Exception:
            pass
    out = _cfg.get("leftovers")
    if out:
        with open(out, "w") as fh:
            json.dump(_leftovers, fh)
