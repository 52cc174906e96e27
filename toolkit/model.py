"""A tiny random llama GGUF, written with the official `gguf` package.

Same parameters -> same bytes (seeded weights, fixed metadata). Vocabulary: 3 specials and
ASCII pieces only, no byte tokens: every token decodes to valid UTF-8, which layout C2's
output parser requires (docs/DESIGN.md, section 8). Random weights are fine: patchkit tests the server's
slot and KV bookkeeping, not the model's prose.
"""
from __future__ import annotations

import hashlib
import os
import string
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from . import cache
from .errors import UsageError


@dataclass(frozen=True)
class ModelSpec:
    name: str = "tiny"
    n_embd: int = 64
    n_head: int = 4
    n_layer: int = 2
    n_ff: int = 128
    context_length: int = 8192  # must be >= any -c a workload uses
    seed: int = 1234


TINY = ModelSpec()
# Same vocabulary, other weights: the draft model of the `speculative` workload.
DRAFT = ModelSpec(name="tiny-draft", n_layer=1, seed=4321)


@dataclass(frozen=True)
class Model:
    path: Path
    sha256: str
    spec: ModelSpec
    n_vocab: int


def vocabulary() -> list[str]:
    """3 specials + 108 distinct ASCII pieces (letters, digits, punctuation, '▁x' pieces)."""
    specials = ["<unk>", "<s>", "</s>"]
    pieces = list(string.ascii_lowercase) + list(string.ascii_uppercase) + list(string.digits)
    pieces += list(".,;:!?-'\"()[]{}/+=*&%")                 # 21
    pieces += ["\u2581" + c for c in string.ascii_lowercase]  # 26 word-start pieces
    pieces.append("\u2581")
    vocab = specials + pieces
    assert len(set(vocab)) == len(vocab), "a duplicate token aborts llama.cpp's loader"
    return vocab


def default_path(spec: ModelSpec = TINY) -> Path:
    return cache.sub("models") / f"{spec.name}-{_spec_key(spec)}.gguf"


def _spec_key(spec: ModelSpec) -> str:
    import gguf
    return cache.digest(asdict(spec), vocabulary(), getattr(gguf, "__version__", "?"), n=12)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ensure(spec: ModelSpec = TINY, out: Path | None = None) -> Model:
    """Write the model to `out` (default: the cache) unless an identical file is there."""
    path = Path(out) if out else default_path(spec)
    sidecar = path.with_name(path.name + ".sha256")
    if out is None and path.exists() and sidecar.exists():
        digest = sha256_of(path)
        if digest == sidecar.read_text().strip():
            return Model(path, digest, spec, len(vocabulary()))
        # truncated or edited on disk: it is ours to regenerate
    write(spec, path)
    digest = sha256_of(path)
    if out is None:
        sidecar.write_text(digest + "\n")
    return Model(path, digest, spec, len(vocabulary()))


def write(spec: ModelSpec, path: Path) -> None:
    import gguf

    if spec.n_embd % spec.n_head:
        raise UsageError(f"n_embd {spec.n_embd} is not a multiple of n_head {spec.n_head}.")
    vocab = vocabulary()
    n_vocab = len(vocab)
    rng = np.random.default_rng(spec.seed)

    def w(*shape: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name(f"patchkit-{spec.name}")
    writer.add_context_length(spec.context_length)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layer)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(spec.n_embd // spec.n_head)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(vocab)
    writer.add_token_scores([-float(i) for i in range(n_vocab)])
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    writer.add_token_types(types + [gguf.TokenType.NORMAL] * (n_vocab - 3))
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)  # prompts are token ids; their length must be exact

    # numpy shape is (rows, cols); GGUF stores it reversed, as llama.cpp expects ({n_embd, n_vocab}, ...)
    writer.add_tensor("token_embd.weight", w(n_vocab, spec.n_embd, scale=1.0))
    for i in range(spec.n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(spec.n_embd, np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"blk.{i}.{name}.weight", w(spec.n_embd, spec.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(spec.n_embd, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", w(spec.n_ff, spec.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", w(spec.n_ff, spec.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", w(spec.n_embd, spec.n_ff))
    writer.add_tensor("output_norm.weight", np.ones(spec.n_embd, np.float32))
    writer.add_tensor("output.weight", w(n_vocab, spec.n_embd, scale=1.0))
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    os.replace(tmp, path)
