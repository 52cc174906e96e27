"""What a long recompute does to a scrape of /slots, with and without the task queue's yield
(issue 36), measured.

recompute-slot decodes a parked slot's whole history when it resumes. On C2 and D the server's
own decode runs inside `queue_tasks.yield_to_queue`, whose worker answers /metrics and /slots
while the decode runs, and the family's recompute does too (fact `decode_yield`). Two builds, one
TU each on the shared build of the default tree:

  yield     recompute-slot as rendered
  no-yield  the same diff with the recompute's decode called directly (the review's finding)

Each runs `ncmpl-survivor` (a 2800-token request parked and recomputed) N times on a fresh
server, /slots polled every 5 ms by the runner. Per run: the cells recomputed (upstream's
counter, scraped after the run), the largest gap between two /slots answers, and how long the
server took to decode the request's 2800-token prompt in the first place (the scale a recompute
of that history has). A benchmark prints figures; it asserts nothing.

    python bench/recompute_yield.py [--runs 3]
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import git  # noqa: E402

from toolkit import apply, build, model, runner, source, workload  # noqa: E402
from toolkit.record import largest_gap  # noqa: E402

WRAPPED = re.compile(r"( *)(?:\w+\.)*yield_to_queue\(\[&\]\(\) \{\n *ok = llama_decode\(c, b\) == 0;\n"
                     r"(?: *.*\n){3} *\}\);\n")


def candidates(repo: git.Repo, base: str) -> dict[str, str]:
    """way -> commit: recompute-slot as rendered, and its recompute decoding outside the yield."""
    right, an = apply.candidate_commit(repo, base, "recompute-slot")
    text = (repo.commit(right).tree / an.file).data_stream.read().decode()
    plain, n = WRAPPED.subn(lambda m: f"{m.group(1)}ok = llama_decode(c, b) == 0;\n", text)
    if n != 1:
        raise SystemExit(f"expected one yield_to_queue around the recompute's decode, found {n}: "
                         "is the default tree's server without a yield (layout A/B)?")
    other = apply.commit_text(repo, base, an.file, plain.encode(), "server: recompute outside the task queue's yield")
    return {"yield": right, "no-yield": other}


def prompt_seconds(log: str) -> float:
    """From the verbose log: the first prompt's decode, first chunk to its first sampled token."""
    stamp = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) ")
    def t(line: str) -> float:
        m, s, ms, us = (int(x) for x in stamp.match(line).groups())  # upstream's "m.ss.mmm.uuu"
        return m * 60 + s + ms / 1e3 + us / 1e6
    lines = [ln for ln in log.splitlines() if stamp.match(ln)]
    start = next(t(ln) for ln in lines if "id  0 | task" in ln and "memory_seq_rm [0, end)" in ln)
    first = next(t(ln) for ln in lines if "id  0 | task" in ln and "n_gen = 1," in ln)
    return first - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    tree = source.fetch(progress=lambda s: None)
    repo = git.Repo(tree.path)
    base = source.resolve(repo, source.BASELINE_TAG)
    wl = workload.load("ncmpl-survivor")
    gguf = model.resolve(wl.model).path
    print(f"{tree.version} ({base[:12]}), workload {wl.name}, model {wl.model}")
    print("| way | run | recomputed cells | largest gap between /slots answers (s) | the prompt's own decode (s) |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        for way, commit in candidates(repo, base).items():
            binary = build.build(repo, commit).binary
            for k in range(args.runs):
                log = Path(d) / f"{way}-{k}.log"
                r = runner.run(binary, gguf, wl, log)
                cells = dict(r.metrics or ()).get("llamacpp:kv_full_recomputed_cells_total", float("nan"))
                gap = largest_gap(sorted({s.t for s in r.samples}))
                print(f"| {way} | {k + 1} | {cells:.0f} | {gap:.3f} | {prompt_seconds(log.read_text(errors='replace')):.3f} |")


if __name__ == "__main__":
    main()
