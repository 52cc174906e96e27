"""What the official `openai` client does with an SSE notice of a parked stream (issue 36), measured.

The fork's #190 sends SSE comments to a stream whose request is parked (`: preempted`) and resumed
(`: resumed`). Whether patchkit's families should is a question of what a client sees: a local
HTTP server (127.0.0.1, Python's own) answers a streamed chat completion with upstream's chunk
format, the two comments and a pause between them, three ways:

  none      the chunks only, the pause silent (patchkit's families)
  comments  `: preempted` before the pause, `: resumed` after it (the fork's #190)
  event     the notice as a data event of its own ({"object": "notice", ...}), not a comment

Per way: what `client.chat.completions.create(stream=True)` yields (the chunks' contents, any
exception), what the loop of the SDK's own README (`chunk.choices[0].delta.content`) does with
it, and what a raw reader of the same bytes (httpx, line by line) sees. A benchmark prints
figures; it asserts nothing.

    python bench/sse_notice.py [--pause 0.5]
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import openai


def chunk(content: str | None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    body = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "witness",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def serve(way: str, pause: float) -> ThreadingHTTPServer:
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(chunk("a") + chunk("b"))
            if way == "comments":
                self.wfile.write(b": preempted\n\n")
            elif way == "event":
                self.wfile.write(b'data: {"object": "notice", "notice": "preempted"}\n\n')
            self.wfile.flush()
            time.sleep(pause)
            if way == "comments":
                self.wfile.write(b": resumed\n\n")
            elif way == "event":
                self.wfile.write(b'data: {"object": "notice", "notice": "resumed"}\n\n')
            self.wfile.write(chunk("c") + chunk(None, "length") + b"data: [DONE]\n\n")
            self.wfile.flush()

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pause", type=float, default=0.5, help="seconds the stream is parked")
    args = ap.parse_args()
    print(f"openai {openai.__version__}, httpx {httpx.__version__}; parked {args.pause:.2f} s")
    print("| way | the SDK yields | exception | the README's loop | largest gap between chunks (s) | raw lines besides data |")
    print("|---|---|---|---|---|---|")
    for way in ("none", "comments", "event"):
        srv = serve(way, args.pause)
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        got, err, times = [], "", []
        try:
            for c in client.chat.completions.create(model="witness", stream=True,
                                                    messages=[{"role": "user", "content": "hi"}]):
                times.append(time.monotonic())
                got.append(c.choices[0].delta.content if c.choices else f"<{c.object}>")
        except Exception as e:  # what the SDK raises is the measurement
            err = f"{type(e).__name__}: {e}"[:80]
        gap = max((b - a for a, b in zip(times, times[1:])), default=0.0)
        try:
            text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                model="witness", stream=True, messages=[{"role": "user", "content": "hi"}]))
            naive = f"'{text}'"
        except Exception as e:
            naive = f"{type(e).__name__}: {e}"[:60]
        with httpx.stream("POST", url + "/v1/chat/completions", json={}) as r:
            raw = [ln for ln in r.iter_lines() if ln and not ln.startswith("data:")]
        print(f"| {way} | {got} | {err or '-'} | {naive} | {gap:.2f} | {raw or '-'} |")
        srv.shutdown()


if __name__ == "__main__":
    main()
