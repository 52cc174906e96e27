"""`patchkit pin`: add or update a PR commit pin in a fork's pr-set.json, gated on a verify report.

The file is edited as text, not re-serialised: `_doc`, order, indentation and the trailing
newline stay byte for byte; only the one entry changes. json-source-map gives the byte
positions of every value. The write is atomic (temp file + rename in the same directory).
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from json_source_map import calculate

from .errors import ReportError, UsageError

OWNERS = ("ggml-org", "unslothai")


@dataclass(frozen=True)
class PinUrl:
    url: str
    owner: str
    pr: int
    sha: str


@dataclass(frozen=True)
class PinResult:
    action: str          # added | replaced | unchanged
    url: str
    old: str | None      # the entry text that was replaced
    text: str            # the whole new file
    changed: bool


def parse_url(url: str, owners: tuple[str, ...] = OWNERS) -> PinUrl:
    m = re.fullmatch(r"https://github\.com/([A-Za-z0-9_.-]+)/llama\.cpp/pull/(\d+)/commits/([0-9a-f]{40})", url)
    if not m:
        raise UsageError(f"'{url}' is not a pinned PR commit URL; expected "
                         "https://github.com/OWNER/llama.cpp/pull/N/commits/<40 hex sha> "
                         "(copy it from the PR's commits tab).")
    if m.group(1) not in owners:
        raise UsageError(f"owner '{m.group(1)}' is not allowed (allowed: {', '.join(owners)}); "
                         "pass --owner to allow it.")
    return PinUrl(url, m.group(1), int(m.group(2)), m.group(3))


def check_report(report_path: Path, sha: str) -> dict:
    try:
        rep = json.loads(Path(report_path).read_text())
    except FileNotFoundError:
        raise ReportError(f"no report at {report_path}; run `patchkit verify --commit {sha[:12]} "
                          "--report-dir DIR` first.")
    except json.JSONDecodeError as e:
        raise ReportError(f"{report_path} is not valid JSON ({e}).")
    if "after" in rep and "changed" in rep:   # a gate.json (`patchkit ci`): the pin must be one it added
        urls = [c["url"] for c in rep["changed"]]
        if not any(u.endswith("/" + sha) for u in urls):
            raise ReportError(f"{report_path} gated {', '.join(urls) or 'no added pin'}, not {sha}; a pin needs a "
                              "gate that added exactly that commit.")
        if rep.get("ok") is not True:
            raise ReportError(f"{report_path} is a failing gate (responsible: "
                              f"{', '.join(c['pin'] for c in rep.get('culprits', [])) or 'see its summary'}); "
                              "refusing to pin.")
        return rep
    source = rep.get("candidate_source_commit")
    if source != sha:
        raise ReportError(f"{report_path} verified {source or 'no pinned commit'}, not {sha}; a pin needs a "
                          "report for exactly that commit.")
    if rep.get("ok") is not True:
        failed = [f"{name}" for name, w in rep.get("workloads", {}).items() if not w.get("ok")]
        raise ReportError(f"{report_path} is a failing verify report (failed: {', '.join(failed) or 'unknown'}); "
                          "refusing to pin.")
    if rep.get("outcome", "PASS") != "PASS":
        raise ReportError(f"{report_path} is an INCONCLUSIVE verify report: nothing failed, but "
                          f"{rep.get('summary', 'a shape was not reached or evidence was missing')}; a pin needs a "
                          "PASS. Run verify again with --repeat 3 (or on a quieter machine).")
    return rep


def edit(text: str, pin: PinUrl, optional: bool = False) -> PinResult:
    """The new file text: replace this PR's entry (same owner + number), or append one."""
    try:
        data = json.loads(text)
        smap = calculate(text)
    except (json.JSONDecodeError, ValueError) as e:
        raise UsageError(f"pr-set file is not valid JSON: {e}.")
    prs = data.get("prs") if isinstance(data, dict) else None
    if not isinstance(prs, list):
        raise UsageError('pr-set file has no "prs" list (expected {"_doc": [...], "prs": [...]}).')
    entry = json.dumps({"url": pin.url, "required": False}) if optional else json.dumps(pin.url)
    for i, item in enumerate(prs):
        url = item.get("url") if isinstance(item, dict) else item
        if not isinstance(url, str):
            raise UsageError(f'pr-set entry {i} is neither a URL nor {{"url": ...}}.')
        try:
            other = parse_url(url, (url.split("/")[3],) if url.count("/") > 3 else OWNERS)
        except UsageError:
            continue
        if (other.owner, other.pr) != (pin.owner, pin.pr):
            continue
        pos = smap[f"/prs/{i}"]
        old = text[pos.value_start.position:pos.value_end.position]
        is_optional = isinstance(item, dict) and item.get("required") is False
        if other.sha == pin.sha and is_optional == optional:
            return PinResult("unchanged", pin.url, old, text, False)
        if isinstance(item, dict) and is_optional == optional:
            # keep the object (and its other keys): only the url string changes
            upos = smap[f"/prs/{i}/url"]
            new = text[:upos.value_start.position] + json.dumps(pin.url) + text[upos.value_end.position:]
        else:
            new = text[:pos.value_start.position] + entry + text[pos.value_end.position:]
        return PinResult("replaced", pin.url, old, new, True)
    arr = smap["/prs"]
    start, end = arr.value_start.position, arr.value_end.position - 1  # '[' and ']'
    if prs:
        last = smap[f"/prs/{len(prs) - 1}"]
        first = smap["/prs/0"]
        indent = text[text.rfind("\n", 0, first.value_start.position) + 1:first.value_start.position]
        if "\n" in text[start:first.value_start.position]:
            ins = ",\n" + indent + entry
        else:
            ins = ", " + entry
        new = text[:last.value_end.position] + ins + text[last.value_end.position:]
    else:
        line_start = text.rfind("\n", 0, start) + 1
        base = re.match(r"[ \t]*", text[line_start:]).group(0)
        new = text[:start + 1] + "\n" + base + "  " + entry + "\n" + base + text[end:]
    return PinResult("added", pin.url, None, new, True)


def write_atomic(path: Path, text: str) -> None:
    path = Path(path)
    mode = path.stat().st_mode & 0o777
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def pin(pr_set: Path, url: str, report: Path, *, optional: bool = False, dry_run: bool = False,
        owners: tuple[str, ...] = OWNERS) -> PinResult:
    pr_set = Path(pr_set)
    p = parse_url(url, owners)
    try:
        text = pr_set.read_text()
    except FileNotFoundError:
        raise UsageError(f"pr-set file {pr_set} does not exist.")
    res = edit(text, p, optional)  # validates the file before the report: cheap errors first
    check_report(report, p.sha)
    if res.changed and not dry_run:
        write_atomic(pr_set, res.text)
    return res
