"""Workloads: the data files in fixtures/workloads/, as frozen dataclasses.

A workload is a TOML file: server flags, requests (slot, prompt token ids, n_predict,
stream, start offset), the expectations that apply, and the sizing arithmetic next to them.
Running one is runner.py's job; this module only reads and checks the files.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path


from . import data_dir
from .errors import UsageError

WORKLOAD_DIR = data_dir("fixtures", "workloads")
N_SPECIAL = 3  # the tiny model's first 3 ids are <unk> <s> </s>: never in prompts


@dataclass(frozen=True)
class Request:
    slot: int
    prompt: tuple[int, ...]
    n_predict: int
    stream: bool = True
    start_ms: int = 0
    # real models: real text, cut to len(prompt) tokens by the server's own /tokenize at run time
    # (prompt holds placeholders until then, so the sizing arithmetic can use its length)
    text: str = ""
    # a repetition penalty over the last 64 tokens (0: none): the sampler then carries state from
    # token to token, which a preemption must keep (greedy alone has none to lose)
    repeat_penalty: float = 0.0
    # completions of this prompt (the server's `n_cmpl`): the request takes its pinned slot and
    # n_cmpl - 1 free ones, children that copy its prompt cells; one HTTP response for the family
    n_cmpl: int = 1
    # stateful sampling (issue 26): temperature > 0 draws from the sampler's RNG (seeded per request,
    # `seed`), top_k 40 and a presence penalty: a survivor's sampler then carries state from token
    # to token, so a patch that resets or disturbs it changes the stream (greedy hides that)
    temperature: float = 0.0
    presence_penalty: float = 0.0
    seed: int = 1
    # the scale of the server's LoRA adapter for this request (ServerFlags.lora; 0: without it): a slot
    # with other adapters batches apart, and its cells must be computed with its own, also when a
    # preemption recomputes them. None: the field is not sent. Every request of a server with the
    # adapter names its scale, 0 included: measured on C2, a request without the field runs with the
    # loaded adapters at scale 1 (--lora-init-without-apply notwithstanding)
    lora: float | None = None
    # sent when the request on slot `after[0]` has streamed `after[1]` tokens (or ended), not at a
    # time: an arrival placed by the server's own steps (a park's window), which a clock would only
    # hit on a machine of one speed. () : at start_ms
    after: tuple[int, ...] = ()

    @property
    def stateful(self) -> bool:
        return bool(self.temperature or self.repeat_penalty or self.presence_penalty)

    def body(self) -> dict:
        b = {
            "prompt": list(self.prompt), "n_predict": self.n_predict, "id_slot": self.slot,
            "ignore_eos": True, "temperature": 0.0, "top_k": 1, "seed": self.seed, "stream": self.stream,
            "return_tokens": True, "cache_prompt": False,
        }
        if self.temperature:
            b.update(temperature=self.temperature, top_k=40, top_p=1.0, min_p=0.0)
        if self.presence_penalty:
            b.update(presence_penalty=self.presence_penalty)
        if self.repeat_penalty:
            b.update(repeat_penalty=self.repeat_penalty, repeat_last_n=64)
        if self.n_cmpl > 1:
            b["n_cmpl"] = self.n_cmpl
        if self.lora is not None:
            b["lora"] = [{"id": 0, "scale": self.lora}]
        return b


@dataclass(frozen=True)
class ServerFlags:
    ctx: int
    parallel: int
    kv_unified: bool = True
    cache_ram: int | None = 0
    threads: int = 2
    batch: int | None = None
    ubatch: int | None = None
    flash_attn: str = "off"
    draft: bool = False  # start with the tiny draft model (speculative decoding)
    lora: bool = False   # load a LoRA adapter for the served model (model.lora): each request names its scale
    extra: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        a = ["-c", str(self.ctx), "-np", str(self.parallel), "-t", str(self.threads), "-fa", self.flash_attn]
        a += ["-kvu"] if self.kv_unified else ["-no-kvu"]
        if self.cache_ram is not None:
            a += ["--cache-ram", str(self.cache_ram)]
        if self.batch:
            a += ["-b", str(self.batch)]
        if self.ubatch:
            a += ["-ub", str(self.ubatch)]
        return a + list(self.extra)


@dataclass(frozen=True)
class Expect:
    base: str = "all-error"         # all-error | unchanged | same
    candidate: str = "one-victim"   # one-victim | unchanged | same (as the base run)
    victim: int | None = None       # the slot the sizing arithmetic predicts (the verdict uses the measured one)
    # survivors' streams == control, victim's a prefix. "after-overflow": judge only from each slot's
    # overflow step on (a real model whose numerics depend on the batch mix; see compare.integrity)
    integrity: bool | str = True
    # the workload puts the victim's undecoded entry before survivors' (so an eviction must
    # shift their batch indices): every judged run must show it, measured (measure.py)
    shift: bool = False
    # another shape the workload is designed to judge (measure.shape), for the policy it names:
    #   "decoded": the victim's entry was decoded before the pool ran out (off > its batch position):
    #              nothing may move, entries below off above all
    #   "prompt-not-largest": the slot holding the most cells is not the one with the longest prompt
    #   "straddled": the victim's entry undecoded, one survivor's before it decoded, one's not (0 < off)
    #   "other-adapters-in-park": (a preempting run) a request with other LoRA adapters than a parked
    #              one decoded between its park and its resume
    #   "parked-past-headroom": (a preempting run) a slot parked holding more than the pool less a
    #              resume's headroom (the families' [params] headroom): it can come back only alone
    shape: str = ""
    # the pairs of the failure point (overflows.PAIRS) the workload is designed to reach, for the
    # largest policy: measured on every judged run like a shape (a start that missed them is made
    # again), and the suite's pairs are judged because each is some workload's by design
    pairs: tuple[str, ...] = ()
    victims: int = 1                # overflows by design (each with one victim): the sizing's arithmetic

    @property
    def overflow_shape(self) -> bool:
        """A shape of the failure point is designed (read on the overflow under the largest policy);
        a park's shape is read on the pauses instead."""
        return bool(self.shift or self.shape not in ("",) + PARK_SHAPES or self.pairs)


# the shapes read on a preempting run's pauses (overflows.designed_park)
PARK_SHAPE = "other-adapters-in-park"
PAST_HEADROOM = "parked-past-headroom"
PARK_SHAPES = (PARK_SHAPE, PAST_HEADROOM)


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    sizing: str
    server: ServerFlags
    requests: tuple[Request, ...]
    expect: Expect
    path: Path | None = None
    model: str = "witness"          # a tiny family (model.FAMILIES), a real model (model.REAL) or a .gguf path

    def first_group(self) -> tuple[Request, ...]:
        """The requests released together at the start (one sent `after` another's tokens is not)."""
        timed = [r for r in self.requests if not r.after]
        first = min(r.start_ms for r in timed)
        return tuple(r for r in timed if r.start_ms == first)

    def control(self) -> "Workload":
        """Same requests, a pool big enough for all of them: the no-overflow control."""
        demand = sum(len(r.prompt) + r.n_predict for r in self.requests)
        ctx = max(self.server.ctx, 2 * demand)
        ctx = -(-ctx // 256) * 256
        flags = ServerFlags(**{**self.server.__dict__, "ctx": ctx})
        return Workload(self.name + "/control", "no-overflow control", "", flags, self.requests,
                        Expect(base="unchanged", candidate="unchanged", integrity=False), self.path, self.model)


def prompt_ids(length: int, salt: int, n_vocab: int = 113) -> tuple[int, ...]:
    """Deterministic, non-special token ids."""
    span = n_vocab - N_SPECIAL
    return tuple(N_SPECIAL + (i * 7 + salt * 31 + (i * i) % 11) % span for i in range(length))


def available() -> list[str]:
    return sorted(p.stem for p in WORKLOAD_DIR.glob("*.toml"))


def read_toml(name_or_path: str, folder: Path, what: str = "workload") -> tuple[Path, dict]:
    """A fixture by name (under `folder`) or any .toml path, read: (path, data). A missing one is
    refused with the names that exist, an unreadable one with the parser's words."""
    path = Path(name_or_path)
    if not path.suffix:
        path = folder / f"{name_or_path}.toml"
    if not path.exists():
        known = sorted(p.stem for p in folder.glob("*.toml"))
        raise UsageError(f"no {what} '{name_or_path}'. Known: {', '.join(known)}; or pass a .toml path.")
    try:
        return path, tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"invalid {what} file {path}: {type(e).__name__}: {e}.")


def load(name_or_path: str) -> Workload:
    path, data = read_toml(name_or_path, WORKLOAD_DIR)
    try:
        return parse(data, path)
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(f"invalid workload file {path}: {type(e).__name__}: {e}.")


def parse(data: dict, path: Path | None = None) -> Workload:
    known_top = {"name", "description", "sizing", "server", "requests", "expect", "model"}
    unknown = set(data) - known_top
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)}")
    s = dict(data["server"])
    if "extra" in s:
        s["extra"] = tuple(s["extra"])
    flags = ServerFlags(**s)
    reqs = []
    for i, r in enumerate(data["requests"]):
        r = dict(r)
        if "text" in r:
            prompt = (0,) * int(r.pop("prompt_len"))
        elif "prompt" in r:
            prompt = tuple(int(t) for t in r.pop("prompt"))
        else:
            prompt = prompt_ids(int(r.pop("prompt_len")), int(r.get("slot", i)))
        if not prompt:
            raise ValueError(f"request {i} has an empty prompt")
        if "after" in r:
            r["after"] = tuple(int(x) for x in r["after"])
        if flags.lora:
            r.setdefault("lora", 0.0)  # named, 0 included: a request without the field gets the adapter
        reqs.append(Request(prompt=prompt, **r))
    slots = [r.slot for r in reqs]
    if len(set(slots)) != len(slots) or any(not 0 <= s < flags.parallel for s in slots):
        raise ValueError(f"request slots {slots} must be distinct and within 0..{flags.parallel - 1}")
    families = [r.slot for r in reqs if r.n_cmpl > 1]
    if len(families) > 1:
        # measured (C2, the default patch, two families beside two plain requests): one family's child
        # took the slot the other family was pinned to, and a right eviction FAILED
        raise ValueError(f"requests on slots {families} are each an n_cmpl family, and patchkit judges one family "
                         "per workload: the server puts a family's children in whichever slots are free at its launch "
                         "(a slot another request is pinned to included), and the checks do not tell which family a "
                         "child belongs to, so its cells would be read as nobody's and a right eviction would FAIL "
                         "(measured on C2). Put each family in a workload of its own")
    for r in reqs:
        if r.after and (len(r.after) != 2 or r.after[0] not in slots or r.after[0] == r.slot or r.after[1] < 1
                        or any(q.slot == r.after[0] and q.after for q in reqs)):
            raise ValueError(f"request on slot {r.slot}: after = {list(r.after)} must be [slot, tokens] naming another "
                             "request's slot (one that itself starts without `after`) and 1 token or more")
    exp = dict(data.get("expect", {}))
    if "pairs" in exp:
        from .overflows import PAIRS
        exp["pairs"] = tuple(exp["pairs"])
        bad = [p for p in exp["pairs"] if p not in PAIRS]
        if bad:
            raise ValueError(f"expect.pairs {bad}: not pairs the batch can hold; known: {list(PAIRS)}")
    exp = Expect(**exp)
    return Workload(data["name"], data.get("description", ""), data.get("sizing", ""), flags,
                    tuple(reqs), exp, path, str(data.get("model", "witness")))
