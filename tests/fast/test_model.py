"""The tiny GGUF: deterministic bytes, a vocabulary that decodes to valid UTF-8 only."""
from toolkit import model, witness


def test_vocabulary_has_no_byte_tokens_and_no_duplicates():
    v = model.vocabulary()
    assert len(v) == len(set(v)) == 113
    assert not any(t.startswith("<0x") for t in v)
    for t in v[3:]:
        t.encode("utf-8")
        assert len(t) == 1, f"{t!r}: a piece of several characters makes tokenization ambiguous"
    assert "\u2581" in v and not {"<", ">"} & set(v)


def test_chat_template_renders_with_vocabulary_characters_only():
    import jinja2
    msgs = [{"role": "system", "content": "be"}, {"role": "user", "content": "hi there"},
            {"role": "assistant", "content": "yo"}, {"role": "user", "content": "and?"}]
    out = jinja2.Environment().from_string(model.CHAT_TEMPLATE).render(messages=msgs, add_generation_prompt=True)
    assert out == "$be|hi there#yo|and?#"
    assert set(out.replace(" ", "\u2581")) <= set(model.vocabulary()[3:])


def test_same_bytes_every_time(tmp_path):
    a = model.ensure(out=tmp_path / "a.gguf")
    b = model.ensure(out=tmp_path / "b.gguf")
    assert a.sha256 == b.sha256
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    assert a.path.stat().st_size < 1 << 20


def test_draft_differs_but_shares_vocabulary(tmp_path):
    import gguf
    t = model.ensure(model.TINY, tmp_path / "t.gguf")
    d = model.ensure(model.DRAFT, tmp_path / "d.gguf")
    assert t.sha256 != d.sha256
    tokens = []
    for p in (t.path, d.path):
        r = gguf.GGUFReader(str(p))
        f = r.fields["tokenizer.ggml.tokens"]
        tokens.append([bytes(f.parts[i]).decode() for i in f.data])
    assert tokens[0] == tokens[1]


def test_every_family_is_deterministic_and_distinct(tmp_path):
    """`patchkit model --arch NAME` twice gives the same bytes, for every family."""
    import gguf
    seen = {}
    for name, spec in model.FAMILIES.items():
        a = model.ensure(spec, tmp_path / f"{name}-a.gguf")
        b = model.ensure(spec, tmp_path / f"{name}-b.gguf")
        assert a.path.read_bytes() == b.path.read_bytes(), name
        seen[name] = a.sha256
        arch = gguf.GGUFReader(str(a.path)).fields["general.architecture"]
        # a witness is a llama (or gemma2) whose weights are set by construction: loaded as such
        assert bytes(arch.parts[arch.data[0]]).decode() == getattr(witness.CONSTRUCTIONS.get(spec.arch), "arch", spec.arch)
    assert len(set(seen.values())) == len(seen)
    assert model.GEMMA2.sliding_window < 100, "the window must be shorter than the workloads' prompts"


def test_model_cli_arch(tmp_path):
    from click.testing import CliRunner

    from toolkit.cli import cli
    outs = [CliRunner().invoke(cli, ["model", "--arch", "lfm2", "--out", str(tmp_path / f"{k}.gguf")]) for k in "ab"]
    assert all(o.exit_code == 0 for o in outs)
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()


def test_unknown_model_is_refused_clearly():
    import pytest

    from toolkit.errors import UsageError
    with pytest.raises(UsageError) as e:
        model.resolve("nope")
    assert "gemma2" in str(e.value) and "smollm2" in str(e.value)
