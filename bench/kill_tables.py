#!/usr/bin/env python3
"""Two campaigns of the same mutants side by side: which check killed each mutant before and
after (e.g. `patchkit mutants --model tiny` against the witness). Prints a markdown table;
asserts nothing.

    python bench/kill_tables.py BEFORE AFTER [--label tiny --label witness]

BEFORE and AFTER are report directories of `patchkit mutants` (their mutants.json) or of
`patchkit mutants --operators` (their operators.json). For the catalog: each mutant's status, its
first killer (the check meant to kill it first when it is among them) and every check that
killed it, so a check that is no longer the only killer shows. For the operator campaign (each
mutant stops at its first failed check): the status and first killer, the rows that differ, and
the counts per first killer.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

OWN = "each workload's own"


def load(d: Path) -> tuple[str, dict]:
    for kind in ("mutants", "operators"):
        p = d / f"{kind}.json"
        if p.exists():
            return kind, json.loads(p.read_text())
    sys.exit(f"{d}: no mutants.json or operators.json")


def catalog_row(m: dict | None) -> tuple[str, str, str]:
    if m is None:
        return "-", "-", "-"
    checks = list(dict.fromkeys(k["check"] for k in m["kills"]))
    first = m["killer"] if m["killer"] in checks else (checks[0] if checks else "-")
    status = "equivalent (claimed)" if m["killer"] == "equivalent" and m["status"] == "ALIVE" else m["status"]
    return status, first, ", ".join(checks) or "-"


def catalog(before: dict, after: dict, labels: list[str]) -> list[str]:
    b = {m["name"]: m for m in before["mutants"]}
    a = {m["name"]: m for m in after["mutants"]}
    out = [f"| mutant | meant for | {labels[0]}: status | first killer | every killer | {labels[1]}: status | "
           "first killer | every killer |", "|---|---|---|---|---|---|---|---|"]
    for name in dict.fromkeys([*b, *a]):
        meant = (b.get(name) or a.get(name))["killer"]
        out.append(f"| {name} | {meant} | " + " | ".join(catalog_row(b.get(name))) + " | "
                   + " | ".join(catalog_row(a.get(name))) + " |")
    for label, doc in zip(labels, (before, after)):
        s = doc["score"]
        out.append(f"\n{label}: {s['killed']}/{s['judged']} killed (model: {doc.get('model') or OWN})")
    return out


def operators(before: dict, after: dict, labels: list[str]) -> list[str]:
    b = {m["id"]: m for m in before["mutants"]}
    a = {m["id"]: m for m in after["mutants"]}
    out = []
    for label, doc in zip(labels, (before, after)):
        by = Counter(m["check"] for m in doc["mutants"] if m["status"] == "killed")
        st = Counter(m["status"] for m in doc["mutants"])
        out.append(f"{label} (model: {doc.get('model') or OWN}): {dict(st)}; first killers: "
                   + ", ".join(f"{k} {v}" for k, v in by.most_common()))
    out += ["", f"| # | line | mutation | {labels[0]} | {labels[1]} |", "|---|---|---|---|---|"]
    for i in sorted(set(b) | set(a)):
        x, y = b.get(i), a.get(i)
        fx = f"{x['status']} {x['check']}".strip() if x else "-"
        fy = f"{y['status']} {y['check']}".strip() if y else "-"
        m = x or y
        mark = "" if fx == fy else " **differs**"
        out.append(f"| {i} | {m['line']} | `{m['original']}` -> `{m['mutated']}` ({m['operator']}) | {fx} | {fy}{mark} |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--label", action="append", default=None)
    args = ap.parse_args()
    labels = args.label or ["before", "after"]
    (kb, b), (ka, a) = load(args.before), load(args.after)
    if kb != ka:
        sys.exit("one catalog and one operator campaign: compare campaigns of one kind")
    print("\n".join((catalog if kb == "mutants" else operators)(b, a, labels)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
