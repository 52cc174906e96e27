"""The tiny GGUF: deterministic bytes, a vocabulary that decodes to valid UTF-8 only."""
from toolkit import model


def test_vocabulary_has_no_byte_tokens_and_no_duplicates():
    v = model.vocabulary()
    assert len(v) == len(set(v)) == 113
    assert not any(t.startswith("<0x") for t in v)
    for t in v[3:]:
        t.encode("utf-8")
        assert all(c.isascii() or c == "\u2581" for c in t)


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
