"""The pinned training text of the real-gradient inputs: Python-like source generated deterministically.

The real-gradient inputs of ``ortho-verify`` are gradients of a small byte-level GPT
(``ortho_verify.inputs.data``). Trained on the running interpreter's standard library, they changed with
the Python version, so a baseline written with one Python failed with another. This module
generates the training text instead: a stream of Python-like modules (docstrings, imports,
classes, functions, loops, conditionals, comments) whose words are drawn with Zipf-like
frequencies from a fixed vocabulary, by a fixed pseudo-random generator (SplitMix64, Steele,
Lea & Flood 2014, "Fast splittable pseudorandom number generators", OOPSLA) written here in
integer arithmetic. Nothing depends on the interpreter's version, the platform, numpy or torch:
the same package version gives the same bytes everywhere, identified by ``CORPUS_SHA256``
(tests/verify/test_corpus.py pins it). Generated, not copied: no third-party text, no licence.

Change the generator only together with ``CORPUS_NAME`` and ``CORPUS_SHA256``: the hash is
recorded in every report and baseline, and a baseline of another corpus is not compared
(``ortho_verify.report.baseline``).
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from functools import lru_cache
from itertools import accumulate

__all__ = ["CORPUS_BYTES", "CORPUS_NAME", "CORPUS_SHA256", "SplitMix64", "corpus_identity", "pinned_corpus"]

#: Name and version of the generator (part of every report's and baseline's corpus identity).
CORPUS_NAME = "ortho-pseudo-python-v1"
#: Bytes of the default corpus (``ortho_verify.inputs.data.GPTConfig.corpus_bytes``).
CORPUS_BYTES = 2_000_000
#: SHA-256 of ``pinned_corpus(CORPUS_BYTES)``.
CORPUS_SHA256 = "bb3bc76e8c46991e0685b08c41813363f51b64a0a3a1f527d0b3e093ef184efa"
_SEED = 20250117
_MASK = (1 << 64) - 1

_WORDS = (
    "value index count name data result item key node path size state table order level step offset limit "
    "buffer line text token error message config option field record entry block frame stream header parser "
    "reader writer handle cache queue stack graph edge weight matrix vector shape rank scale factor norm "
    "sum total mean delta start stop end first last next prev left right top bottom width height length "
    "source target input output module package object type class method function call args kwargs default "
    "number string bytes list dict set tuple flag mode format encoding status event signal timer thread "
    "process worker server client request response session user group role access permission file folder "
    "temp copy move read write open close load save update insert delete find match split join strip check "
    "parse build make create apply reset clear merge sort filter reduce map wrap run test verify compute "
    "the a of to in is for and with that this not be on by as it are from or an if at when each new all "
    "return returns raise raises given must should may can only one two three zero empty none true false"
).split()
_MODULES = ("os", "sys", "re", "io", "json", "math", "time", "struct", "functools", "itertools", "collections",
            "typing", "pathlib", "logging", "string", "codecs", "random", "heapq", "bisect", "operator")
_OPERATORS = (" + ", " - ", " * ", " // ", " % ", " == ", " != ", " < ", " >= ", " and ", " or ", " in ")


class SplitMix64:
    """SplitMix64 (Steele, Lea & Flood 2014): 64-bit outputs from a 64-bit counter, in integer
    arithmetic only, so the stream is the same on every interpreter and platform.

    ``below(n)``: an int in [0, n) (n >= 1; multiply-shift, bias < n / 2^64).
    """

    def __init__(self, seed: int) -> None:
        self.state = seed & _MASK

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        return (self.next() * n) >> 64


class _Writer:
    """Emits Python-like text; words ranked by Zipf weights ⌊2^20 / (k + 1)⌋ (integers: no floats)."""

    def __init__(self, rng: SplitMix64) -> None:
        self.rng = rng
        self.cumulative = list(accumulate((1 << 20) // (k + 1) for k in range(len(_WORDS))))
        self.lines: list[str] = []

    def word(self) -> str:
        return _WORDS[bisect_right(self.cumulative, self.rng.below(self.cumulative[-1]))]

    def ident(self) -> str:
        return "_".join(self.word() for _ in range(1 + self.rng.below(3)))

    def pick(self, options):
        return options[self.rng.below(len(options))]

    def sentence(self) -> str:
        text = " ".join(self.word() for _ in range(4 + self.rng.below(10)))
        return text[0].upper() + text[1:] + "."

    def expr(self, depth: int = 0) -> str:
        kind = self.rng.below(6 if depth < 2 else 3)
        if kind == 0:
            return str(self.rng.below(1 << (1 + self.rng.below(16))))
        if kind == 1:
            return repr(" ".join(self.word() for _ in range(1 + self.rng.below(3))))
        if kind == 2:
            return self.ident()
        if kind == 3:
            return f"{self.ident()}({', '.join(self.expr(depth + 1) for _ in range(self.rng.below(4)))})"
        if kind == 4:
            return f"{self.expr(depth + 1)}{self.pick(_OPERATORS)}{self.expr(depth + 1)}"
        return f"{self.ident()}.{self.ident()}[{self.expr(depth + 1)}]"

    def body(self, indent: str, depth: int) -> None:
        for _ in range(1 + self.rng.below(5)):
            kind = self.rng.below(7 if depth < 2 else 3)
            if kind == 0:
                self.lines.append(f"{indent}# {self.sentence()}")
            elif kind in (1, 2):
                self.lines.append(f"{indent}{self.ident()} = {self.expr()}")
            elif kind == 3:
                self.lines.append(f"{indent}if {self.expr()}:")
                self.body(indent + "    ", depth + 1)
            elif kind == 4:
                self.lines.append(f"{indent}for {self.word()} in {self.expr()}:")
                self.body(indent + "    ", depth + 1)
            elif kind == 5:
                self.lines.append(f"{indent}{self.ident()}.{self.word()}({self.expr()})")
            else:
                self.lines.append(f"{indent}while {self.expr()}:")
                self.body(indent + "    ", depth + 1)
        self.lines.append(f"{indent}return {self.expr()}")

    def function(self, indent: str) -> None:
        args = ", ".join((["self"] if indent else []) + [self.ident() for _ in range(self.rng.below(4))])
        self.lines.append(f"{indent}def {self.ident()}({args}):")
        self.lines.append(f'{indent}    """{self.sentence()}"""')
        self.body(indent + "    ", 0)
        self.lines.append("")

    def module(self) -> None:
        self.lines.append(f'"""{self.sentence()} {self.sentence()}"""')
        self.lines.append("")
        for _ in range(1 + self.rng.below(4)):
            self.lines.append(f"import {self.pick(_MODULES)}" if self.rng.below(2) else
                              f"from {self.pick(_MODULES)} import {self.ident()}")
        self.lines.append("")
        for _ in range(2 + self.rng.below(6)):
            if self.rng.below(3):
                self.function("")
            else:
                self.lines.append(f"class {self.word().capitalize()}{self.word().capitalize()}:")
                self.lines.append(f'    """{self.sentence()}"""')
                self.lines.append("")
                for _ in range(1 + self.rng.below(4)):
                    self.function("    ")
        self.lines.append("")


def pinned_corpus(max_bytes: int = CORPUS_BYTES) -> bytes:
    """The first ``max_bytes`` bytes of the generated corpus (ASCII Python-like source text).

    Deterministic: a prefix of every longer call, the same bytes on every interpreter and
    platform; ``pinned_corpus(CORPUS_BYTES)`` hashes to ``CORPUS_SHA256``. About 0.3 s per 2 MB
    (pure Python); the last result is cached in memory.
    Raises: ValueError if ``max_bytes`` is negative.
    """
    if max_bytes < 0:
        raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
    return _generate(max_bytes)


@lru_cache(maxsize=2)
def _generate(max_bytes: int) -> bytes:
    writer = _Writer(SplitMix64(_SEED))
    size, start = 0, 0
    while size < max_bytes:
        writer.module()
        size += sum(len(line) + 1 for line in writer.lines[start:])
        start = len(writer.lines)
    return ("\n".join(writer.lines) + "\n").encode("ascii")[:max_bytes]


def corpus_identity(max_bytes: int = CORPUS_BYTES) -> dict:
    """{"name", "bytes", "sha256"} of ``pinned_corpus(max_bytes)``: what reports and baselines
    record. For the default size the stored ``CORPUS_SHA256`` is used (no generation)."""
    digest = CORPUS_SHA256 if max_bytes == CORPUS_BYTES else hashlib.sha256(pinned_corpus(max_bytes)).hexdigest()
    return {"name": CORPUS_NAME, "bytes": max_bytes, "sha256": digest}
