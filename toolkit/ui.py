"""Progress and output: human lines on stderr, machine output (--json, paths) on stdout.

GitHub Actions gets collapsible groups; --json (quiet) silences progress entirely.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable

_log = logging.getLogger("patchkit")
_last = [0.0]


def log_progress(msg: str) -> None:
    """The library's default progress when no UI asks: the `patchkit` logger (the real test tier
    shows it live, so a long step is never silent). Lines of a running tool's output ("[n/N]"
    steps, `  ` continuation lines) at most every 10 s; every stage line at once."""
    if msg.startswith(("[", "  ")) and time.monotonic() - _last[0] < 10 and "still" not in msg:
        return
    _last[0] = time.monotonic()
    _log.info(msg)


@contextmanager
def heartbeat(say: Callable[[str], None], what: Callable[[], str], every: float = 20.0):
    """Say `what()` every `every` seconds until the block ends: a step that runs for minutes
    without output of its own (one sanitizer TU, a single-TU compile) is never silent."""
    done = threading.Event()
    start = time.monotonic()

    def beat() -> None:
        while not done.wait(every):
            say(f"  still {what()} ({time.monotonic() - start:.0f} s)")

    th = threading.Thread(target=beat, daemon=True)
    th.start()
    try:
        yield
    finally:
        done.set()
        th.join()


class UI:
    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self.gha = os.environ.get("GITHUB_ACTIONS") == "true"
        self._live = False

    def _clear(self) -> None:
        if self._live:
            sys.stderr.write("\r\033[K")
            self._live = False

    # quiet (--json, or a library caller): nothing on stderr; the lines go to the `patchkit` logger,
    # which prints nothing unless someone configured it (the test tier shows it live)
    def say(self, msg: str) -> None:
        if self.quiet:
            return log_progress(msg)
        self._clear()
        print(msg, file=sys.stderr, flush=True)

    def progress(self, msg: str) -> None:
        """A transient line on a terminal (overwritten), a normal line elsewhere but rate-limited."""
        if self.quiet:
            return log_progress(msg)
        if self.tty:
            sys.stderr.write("\r\033[K" + msg[: os.get_terminal_size(2).columns - 1])
            sys.stderr.flush()
            self._live = True
        elif not msg.startswith("[") or msg.split("/")[0].endswith(("0", "5")) or "/" not in msg:
            # ninja's [n/N] lines: every 5th step is enough in a log
            print(msg, file=sys.stderr, flush=True)

    @contextmanager
    def step(self, title: str):
        start = time.monotonic()
        if self.gha and not self.quiet:
            print(f"::group::{title}", file=sys.stderr, flush=True)
        else:
            self.say(f"==> {title}")
        try:
            yield
        finally:
            self._clear()
            took = time.monotonic() - start
            if self.gha and not self.quiet:
                print("::endgroup::", file=sys.stderr, flush=True)
            self.say(f"    {title}: {took:.1f} s")


def help_list(names, lead: str = "", width: int = 44) -> str:
    """`names` for a click help text as a paragraph of its own starting with `lead`, never split
    inside a name: click rewraps help text and breaks at hyphens (`text-` / `overflow-4`). The
    names go in lines of at most `width` characters (an 80-column terminal leaves 46 for an
    option's help) under click's `\b` marker, which tells click to keep the paragraph as is."""
    lines = [lead.rstrip()] if lead.strip() else []
    for name in names:
        if lines and len(lines[-1]) + len(name) + 2 <= width:
            lines[-1] += f" {name},"
        else:
            lines.append(f"{name},")
    if lines and lines[-1].endswith(","):
        lines[-1] = lines[-1][:-1] + "."
    return "\n\n\b\n" + "\n".join(lines)
