"""ortho_verify.inputs.corpus: the pinned training text of the real-gradient inputs is the same bytes on every
interpreter (its hash is pinned here), a prefix-consistent stream, from a reference SplitMix64."""

import hashlib

import pytest
from hypothesis import given, settings, strategies as st

from ortho_verify.inputs import corpus, data


def test_pinned_corpus_hash_is_the_recorded_one():
    text = corpus.pinned_corpus()
    assert len(text) == corpus.CORPUS_BYTES == data.GPTConfig().corpus_bytes
    assert hashlib.sha256(text).hexdigest() == corpus.CORPUS_SHA256
    assert corpus.corpus_identity() == {"name": corpus.CORPUS_NAME, "bytes": corpus.CORPUS_BYTES,
                                        "sha256": corpus.CORPUS_SHA256}


def test_splitmix64_matches_the_reference_stream():
    # splitmix64.c (Vigna, public domain reference of Steele, Lea & Flood 2014), seed 1234567
    rng = corpus.SplitMix64(1234567)
    assert [rng.next() for _ in range(5)] == [6457827717110365317, 3203168211198807973, 9817491932198370423,
                                              4593380528125082431, 16408922859458223821]


@settings(deadline=None)
@given(st.integers(0, 50_000), st.integers(0, 50_000))
def test_shorter_corpora_are_prefixes(a, b):
    small, large = sorted((a, b))
    assert corpus.pinned_corpus(large)[:small] == corpus.pinned_corpus(small)
    assert len(corpus.pinned_corpus(small)) == small


def test_corpus_is_ascii_text_with_python_structure():
    text = corpus.pinned_corpus(100_000).decode("ascii")
    assert text.count("\ndef ") > 30 and "class " in text and '"""' in text and "    return " in text
    assert len(set(text)) > 40  # letters, digits, punctuation, indentation


def test_identity_of_another_size_is_hashed():
    ident = corpus.corpus_identity(1000)
    assert ident["sha256"] == hashlib.sha256(corpus.pinned_corpus(1000)).hexdigest() != corpus.CORPUS_SHA256
    with pytest.raises(ValueError, match="max_bytes"):
        corpus.pinned_corpus(-1)


def test_training_reads_the_pinned_corpus(monkeypatch):
    # the real inputs do not depend on the interpreter's standard library
    monkeypatch.setattr(data, "stdlib_files", lambda: iter(()))
    config = data.GPTConfig(d_model=16, n_layers=1, n_heads=2, context=16, batch_size=4, steps=2, capture_steps=(2,),
                            corpus_bytes=20_000)
    assert len(data.train_and_capture(config)) == 7
