#!/usr/bin/env python3
"""Each tiny family's speed on the default tree's base llama-server: prints figures, asserts nothing.

    python bench/models.py [--model NAME ...] [--threads N]

Per model, on `-c 4096 -np 4 -kvu` (threads 1, flash attention off, as the workloads run them),
greedy over /completion: 600 tokens from an 8-token prompt (decode), and 32 tokens after an
800-token prompt (prefill then decode). The workloads are decode-bound: the first figure is what
the demo's time follows. Run it alone: a second job beside it changes every figure.
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import git  # noqa: E402
import httpx  # noqa: E402

from toolkit import build, model, server, source  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", help="a tiny family (default: every one)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    tree = source.fetch(progress=lambda s: None)
    binary = build.build(git.Repo(tree.path), source.BASELINE_TAG, progress=lambda s: None).binary
    rng = random.Random(1)
    print(f"{'model':16} {'decode tok/s':>13} {'800+32 tok/s':>13}")
    for name in args.model or list(model.FAMILIES):
        m = model.ensure(model.FAMILIES[name])
        flags = ["-c", "4096", "-np", "4", "-kvu", "-t", str(args.threads), "-fa", "off", "--cache-ram", "0"]
        with tempfile.TemporaryDirectory() as tmp, server.Server(binary, m.path, flags, Path(tmp) / "s.log") as ep:
            rates = []
            for n_prompt, n_gen in ((8, 600), (800, 32)):
                prompt = [rng.randrange(3, m.n_vocab) for _ in range(n_prompt)]
                body = {"prompt": prompt, "n_predict": n_gen, "temperature": 0, "cache_prompt": False,
                        "ignore_eos": True}
                t0 = time.monotonic()
                httpx.post(f"{ep.url}/completion", json=body, timeout=600).raise_for_status()
                rates.append(n_gen / (time.monotonic() - t0))
        print(f"{name:16} {rates[0]:13.0f} {rates[1]:13.0f}")


if __name__ == "__main__":
    main()
