"""Source trees: the llama.cpp tree vendored in a PyPI sdist, and users' own git checkouts.

`fetch` downloads an sdist from the package index (the only network patchkit uses: the
index's JSON API, else pip), extracts its
`vendor/llama.cpp` into the cache and makes it a git repository with one baseline commit.
`open_repo` / `resolve` / `dirty_files` are the read-only questions every later stage asks
of a user's repository.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import git

from . import cache, proc
from .errors import EnvironmentProblem, RepoError, UsageError

DEFAULT_PACKAGE = "llama-cpp-python"
DEFAULT_VERSION = "0.3.35"  # layout C2: what fork maintainers ship today
PACKAGES = {
    "llama-cpp-python": "llama_cpp_python",
    "ik-llama-cpp-python": "ik_llama_cpp_python",
}
# Fixed identity and date: the baseline commit of a given sdist has the same SHA everywhere.
BOT = {
    "GIT_AUTHOR_NAME": "patchkit", "GIT_AUTHOR_EMAIL": "patchkit@localhost",
    "GIT_COMMITTER_NAME": "patchkit", "GIT_COMMITTER_EMAIL": "patchkit@localhost",
}
FIXED_DATE = "2000-01-01T00:00:00+0000"
BASELINE_TAG = "patchkit-baseline"


@dataclass(frozen=True)
class Tree:
    package: str
    version: str
    path: Path
    commit: str
    fetched: bool  # False when it came from the cache


def tree_dir(package: str, version: str) -> Path:
    return cache.root() / "trees" / f"{package}-{version}"


def fetch(package: str = DEFAULT_PACKAGE, version: str = DEFAULT_VERSION, progress=print) -> Tree:
    if package not in PACKAGES:
        raise UsageError(f"unknown package '{package}'; choose one of: {', '.join(PACKAGES)}.")
    dest = tree_dir(package, version)
    if (dest / ".git").is_dir():
        return Tree(package, version, dest, _baseline(dest), fetched=False)

    with cache.locked(cache.root() / "locks" / f"fetch-{package}-{version}"):
        if (dest / ".git").is_dir():  # another process finished it meanwhile
            return fetch(package, version, progress)
        sdist = _download(package, version, progress)
        progress(f"extracting vendor/llama.cpp from {sdist.name}")
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=dest.parent if dest.parent.exists() else cache.sub("trees")))
        try:
            _extract_vendor(sdist, tmp)
            repo = git.Repo.init(tmp, initial_branch="main")
            # -f: the sdist is the truth; llama.cpp's own .gitignore must not drop files from it
            repo.git.add("-A", "-f")
            env = dict(BOT, GIT_AUTHOR_DATE=FIXED_DATE, GIT_COMMITTER_DATE=FIXED_DATE)
            with repo.git.custom_environment(**env):
                repo.git.commit("-q", "--no-verify", "-m", f"{package} {version}: vendor/llama.cpp baseline")
            repo.git.tag(BASELINE_TAG)
            tmp.rename(dest)  # atomic: a tree is either complete or absent
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return Tree(package, version, dest, _baseline(dest), fetched=True)


def _baseline(path: Path) -> str:
    # the tag, not HEAD: someone may have run `patchkit apply` in the cached tree
    return git.Repo(path).git.rev_parse(f"{BASELINE_TAG}^{{commit}}")


def _download(package: str, version: str, progress) -> Path:
    sdists = cache.sub("sdists")
    stem = f"{PACKAGES[package]}-{version}"
    for cand in sdists.glob(f"{stem}.tar.gz"):
        return cand
    try:
        return _download_direct(package, f"{stem}.tar.gz", sdists, progress)
    except _NoDirect as e:
        progress(f"  the index's JSON API did not serve it ({e}); asking pip")
    return _download_pip(package, version, stem, sdists, progress)


class _NoDirect(Exception):
    """The package index could not hand over the sdist by its JSON API (pip may still)."""


def index_url() -> str:
    """The simple index pip would use first: PIP_INDEX_URL, else PyPI."""
    return (os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple").rstrip("/")


def _download_direct(package: str, filename: str, sdists: Path, progress, timeout: float = 60.0) -> Path:
    """The sdist straight from the index's JSON simple API (PEP 691), checked against the sha256
    the index lists. `pip download` of an sdist also prepares its metadata (it installs the
    package's build backend and runs it: ~40 s measured for llama-cpp-python), which a tree
    extraction never needs."""
    import hashlib

    import httpx

    url = f"{index_url()}/{package}/"
    try:
        with httpx.Client(timeout=timeout, follow_redirects=True, trust_env=True) as client:
            r = client.get(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
            if r.status_code != 200 or "json" not in r.headers.get("content-type", ""):
                raise _NoDirect(f"{url}: HTTP {r.status_code}, {r.headers.get('content-type', '?')}")
            files = [f for f in r.json().get("files", []) if f.get("filename") == filename]
            if not files or "sha256" not in files[0].get("hashes", {}):
                raise _NoDirect(f"{url} lists no {filename} with a sha256")
            entry = files[0]
            progress(f"downloading {filename} from {httpx.URL(entry['url']).host}")
            tmp = sdists / f".{filename}.{os.getpid()}.part"
            digest, got, said = hashlib.sha256(), 0, time.monotonic()
            try:
                with client.stream("GET", entry["url"]) as resp, open(tmp, "wb") as fh:
                    if resp.status_code != 200:
                        raise _NoDirect(f"{entry['url']}: HTTP {resp.status_code}")
                    total = int(resp.headers.get("content-length", 0))
                    for chunk in resp.iter_bytes(1 << 20):
                        fh.write(chunk)
                        digest.update(chunk)
                        got += len(chunk)
                        if time.monotonic() - said >= 3.0:
                            said = time.monotonic()
                            progress(f"  downloaded {got / 1e6:.1f} MB" + (f" of {total / 1e6:.1f} MB" if total else ""))
                if digest.hexdigest() != entry["hashes"]["sha256"]:
                    raise EnvironmentProblem(f"{filename} from {entry['url']} does not match the sha256 the index "
                                             f"lists ({digest.hexdigest()[:16]}... != {entry['hashes']['sha256'][:16]}"
                                             "...); nothing was kept.", hint="Try again; a proxy may have altered it.")
                progress(f"  downloaded {got / 1e6:.1f} MB, sha256 verified")
                final = sdists / filename
                tmp.replace(final)  # atomic: a cached sdist is whole or absent
                return final
            finally:
                tmp.unlink(missing_ok=True)
    except httpx.HTTPError as e:
        raise _NoDirect(f"{type(e).__name__}: {e}") from None


def _download_pip(package: str, version: str, stem: str, sdists: Path, progress) -> Path:
    progress(f"downloading {package}=={version} sdist with pip (~75 MB)")
    # pip shows no progress without a terminal: it downloads into a temp dir under TMPDIR, so
    # give it a private one and report the bytes that arrived there, against the size pip names
    tmp = Path(tempfile.mkdtemp(prefix="pip-", dir=sdists))
    watch = _PipWatch(tmp, progress)
    done = threading.Event()
    on_line = watch.on_line

    def ticker() -> None:
        while not done.wait(watch.every):
            watch.tick()

    th = threading.Thread(target=ticker, daemon=True)
    th.start()
    try:
        res = proc.stream(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--progress-bar", "off",
             "-d", str(sdists), f"{package}=={version}"],
            log_path=sdists / "download.log", on_line=on_line, env=dict(os.environ, TMPDIR=str(tmp)), timeout=900)
    finally:
        done.set()
        th.join()
        shutil.rmtree(tmp, ignore_errors=True)
    found = list(sdists.glob(f"{stem}.tar.gz"))
    if res.rc != 0 or not found:
        tail = (res.err or res.out).strip().splitlines()[-3:]
        raise EnvironmentProblem(
            f"could not download {package}=={version} from PyPI (pip exit {res.rc}): " + " / ".join(tail),
            hint="Check the version exists (`pip index versions " + package + "`) and PyPI is reachable.",
        )
    return found[0]


class _PipWatch:
    """What `pip download` is doing, said every few seconds: the archive's bytes while they
    arrive, then pip's own step ("Installing build dependencies", "Preparing metadata") at least
    every `quiet` seconds, so the minute pip spends building the sdist's metadata is not silent.
    pip creates and deletes its temp dirs while we look: a file or directory that vanishes
    mid-walk is skipped, and `tick` never raises (progress is best effort, never a traceback)."""

    def __init__(self, tmp: Path, progress, every: float = 3.0, quiet: float = 15.0):
        self.tmp, self.progress, self.every, self.quiet = tmp, progress, every, quiet
        self.total: str | None = None
        self.step = "pip started"  # pip's latest step, as it put it
        self.start = self.said = time.monotonic()
        self.got = 0

    def on_line(self, line: str) -> None:
        text = line.strip()
        m = re.search(r"Downloading \S+ \(([\d.]+ [kMG]B)\)", text)
        if m:
            self.total, self.step = m.group(1), f"downloading {m.group(1)}"
            return
        # "Installing build dependencies: started" / "...: finished with status 'done'"
        m = re.match(r"(.+?): (started|finished with status '(\w+)')$", text)
        if m:
            self.step = text
            if m.group(2) == "started":
                self.progress(f"  pip: {m.group(1)}")
                self.said = time.monotonic()

    def tick(self, now: float | None = None) -> str | None:
        """One look; returns (and says) the line it said, if any."""
        try:
            now = time.monotonic() if now is None else now
            got = archive_bytes(self.tmp)
            if got > self.got:
                msg = f"  downloaded {got / 1e6:.1f} MB" + (f" of {self.total}" if self.total else "")
            elif now - self.said >= self.quiet:
                msg = f"  still waiting for pip ({now - self.start:.0f} s; last: {self.step})"
            else:
                return None
            self.got, self.said = max(got, self.got), now
            self.progress(msg)
            return msg
        except Exception:  # noqa: BLE001 - a progress line is never worth a traceback
            return None


def archive_bytes(tmp: Path) -> int:
    """Size of the largest *.tar.gz under `tmp` (the archive itself, not what pip unpacks next to
    it to read its metadata); 0 when none. Entries pip deletes while we walk are skipped."""
    best = 0
    for dirpath, _dirs, files in os.walk(tmp):  # os.walk ignores directories that vanish
        for name in files:
            if name.endswith(".tar.gz"):
                try:
                    best = max(best, os.stat(os.path.join(dirpath, name)).st_size)
                except OSError:  # gone between the listing and the stat
                    pass
    return best


def _extract_vendor(sdist: Path, dest: Path) -> None:
    """Extract only <top>/vendor/<llama.cpp or ik_llama.cpp>/ into dest, flattened."""
    with tarfile.open(sdist) as tf:
        members = tf.getmembers()
        prefix = None
        for m in members:
            parts = m.name.split("/")
            if len(parts) >= 4 and parts[1] == "vendor" and parts[3] == "CMakeLists.txt":
                prefix = "/".join(parts[:3]) + "/"
                break
        if prefix is None:
            raise UsageError(f"{sdist.name} has no vendor/<llama.cpp>/CMakeLists.txt; not a llama.cpp sdist.")
        chosen = []
        for m in members:
            if m.name.startswith(prefix) and len(m.name) > len(prefix):
                m.name = m.name[len(prefix):]
                # the sdist keeps the submodule's `.git` gitlink file; it points nowhere here
                if m.name == ".git" or m.name.startswith(".git/"):
                    continue
                chosen.append(m)
        tf.extractall(dest, members=chosen, filter="data")


# ---- questions about a user's repository (read-only) ----

def open_repo(path: str | Path) -> git.Repo:
    p = Path(path).expanduser()
    if not p.exists():
        raise RepoError(f"{p} does not exist.")
    try:
        repo = git.Repo(p, search_parent_directories=False)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise RepoError(
            f"{p} is not a git repository (no .git at its top level).",
            hint="Pass the top of a llama.cpp checkout, or run `patchkit source fetch` to get one.",
        )
    if repo.bare:
        raise RepoError(f"{p} is a bare repository; patchkit needs a checkout.")
    return repo


def resolve(repo: git.Repo, ref: str | None) -> str:
    """Full commit SHA of `ref` (default HEAD)."""
    try:
        return repo.git.rev_parse("--verify", "--quiet", f"{ref or 'HEAD'}^{{commit}}")
    except git.GitCommandError:
        raise RepoError(f"'{ref or 'HEAD'}' is not a commit in {repo.working_tree_dir}.")


def dirty_files(repo: git.Repo) -> list[str]:
    """Modified, staged and untracked (not ignored) files, as `git status` names them."""
    out = repo.git.status("--porcelain", "--untracked-files=all")
    return [line[3:] for line in out.splitlines() if line.strip()]


def current_branch(repo: git.Repo) -> str | None:
    try:
        return repo.active_branch.name
    except TypeError:  # detached HEAD
        return None
