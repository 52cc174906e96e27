"""What the official `openai` client does with the eviction's answer (issue 36), measured.

Four NON-streamed chat requests, released together, on a unified pool of 1024 cells that holds
any three of them but not four (overflow-4's sizes as chat): the eviction ends one. Streamed, the
error arrives inside a 200 stream and the SDK does not retry it (docs/measured.md, traffic); not
streamed, the victim gets the HTTP status the patch chose, and the SDK's default policy
(max_retries=2) decides. Two answers are compared, each on its own build (one TU on the shared
build of the default tree):

  500  patchkit's eviction as rendered: upstream's ERROR_TYPE_SERVER, "Context size has been exceeded."
  503  the same diff answering ERROR_TYPE_UNAVAILABLE "slot evicted: the KV cache is full, retry later"

Per run and answer: each user's HTTP attempts (status, seconds from the release), the SDK's
final outcome, and how many evictions the server logged. A benchmark prints figures; it asserts
nothing.

    python bench/victim_answer.py [--runs 3]
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import git  # noqa: E402

from toolkit import apply, build, model, source  # noqa: E402
from toolkit.server import Server  # noqa: E402

SAID = 'const std::string err = "Context size has been exceeded.";'
SEND = "send_error(slot, err);"


def candidates(repo: git.Repo, base: str) -> dict[str, str]:
    """answer -> commit: the rendered eviction, and the same diff answering 503."""
    right, an = apply.candidate_commit(repo, base)
    text = (repo.commit(right).tree / an.file).data_stream.read().decode()
    i = text.index(SAID)
    j = text.index(SEND, i)
    unavailable = (text[:i] + 'const std::string err = "slot evicted: the KV cache is full, retry later";'
                   + text[i + len(SAID):j] + "send_error(slot, err, ERROR_TYPE_UNAVAILABLE);" + text[j + len(SEND):])
    other = apply.commit_text(repo, base, an.file, unavailable.encode(), "server: evict one slot, answer it 503")
    return {"500": right, "503": other}


def one_run(binary: Path, gguf: Path, log: Path) -> tuple[list[dict], int]:
    import httpx
    import openai

    users: list[dict] = [{"attempts": [], "outcome": ""} for _ in range(4)]
    start = threading.Barrier(4)
    t0 = [0.0]

    def user(k: int, url: str) -> None:
        def on_response(r):
            users[k]["attempts"].append((r.status_code, round(time.monotonic() - t0[0], 2)))
        http = httpx.Client(trust_env=False, timeout=60.0, event_hooks={"response": [on_response]})
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="patchkit", http_client=http)
        start.wait()
        if k == 0:
            t0[0] = time.monotonic()
        try:
            r = c.chat.completions.create(model="patchkit", temperature=0, max_tokens=240,
                                          messages=[{"role": "user", "content": "a" * (40 + 20 * k)}])
            users[k]["outcome"] = f"completed, {r.usage.completion_tokens} tokens"
        except openai.APIStatusError as e:
            users[k]["outcome"] = f"{type(e).__name__} {e.status_code}"
        except openai.APIError as e:
            users[k]["outcome"] = type(e).__name__
        finally:
            http.close()

    with Server(binary, gguf, ["-c", "1024", "-np", "4", "-kvu", "-t", "1", "--cache-ram", "0", "--verbose"],
                log) as ep:
        threads = [threading.Thread(target=user, args=(k, ep.url)) for k in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
    evictions = len(re.findall(r"KV cache is full: terminating slot", log.read_text(errors="replace")))
    return users, evictions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    tree = source.fetch(progress=lambda s: None)
    repo = git.Repo(tree.path)
    base = source.resolve(repo, source.BASELINE_TAG)
    gguf = model.resolve("witness").path
    with tempfile.TemporaryDirectory() as d:
        for answer, commit in candidates(repo, base).items():
            binary = build.build(repo, commit).binary
            for k in range(args.runs):
                users, evictions = one_run(binary, gguf, Path(d) / f"{answer}-{k}.log")
                print(f"answer {answer}, run {k + 1}: {evictions} eviction(s) logged")
                for u, rec in enumerate(users):
                    tries = ", ".join(f"{s} at {t:.2f} s" for s, t in rec["attempts"])
                    print(f"  user {u}: {len(rec['attempts'])} attempt(s) [{tries}] -> {rec['outcome']}")


if __name__ == "__main__":
    main()
