"""Replay data that needs no download: a generated corpus, a word-level tokenizer and batches in a fixed order.

The corpus is English-like text from a small grammar over a generated lexicon (names, nouns, verbs, adjectives,
places: syllable words, as many as the vocabulary holds) with Zipf-distributed word choice and arithmetic facts, so a
model has real structure to learn (word order, agreement of a template, sums). The ``pretrain`` corpus is what a
scratch run trains on; the ``finetune`` corpus is shifted (question/answer templates, another word distribution) for
the LoRA replay. Everything is a pure function of the vocabulary size and the seed (``random.Random``).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from functools import cache

import torch

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
FUNCTION_WORDS = ("the", "a", "in", "of", "and", "is", "plus", "minus", "likes", "sees", "near", ".", ",", "?", ":",
                  "question", "answer", "what", "who", "where", "today", "every", "never", "was", "not")
MAX_NUMBER = 40
WORD_CLASSES = ("name", "noun", "verb", "adj", "place")
SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
ZIPF_S = 1.1
SENTENCES_PER_BATCH_TOKEN = 8  # generated sentences per token of one step (ample: the stream is cut to length)

PRETRAIN_TEMPLATES = (
    "{name} {verb} the {adj} {noun} in the {place} .",
    "the {noun} of {name} is {adj} .",
    "{name} and {name2} {verb} a {noun} near the {place} .",
    "{a} plus {b} is {sum} .",
    "every {noun} in the {place} is {adj} .",
)
FINETUNE_TEMPLATES = (
    "question : what is {a} plus {b} ? answer : {sum} .",
    "question : who likes the {noun} ? answer : {name} .",
    "question : where was {name} today ? answer : the {place} .",
    "{name} never {verb} the {noun} , {name2} likes the {adj} {noun} .",
)


def _lexicon(vocab: int) -> dict[str, list[str]]:
    """Distinct syllable words for each word class, together filling the vocabulary after the fixed words."""
    fixed = len(SPECIALS) + len(FUNCTION_WORDS) + MAX_NUMBER * 2 + 1
    per_class = max(4, (vocab - fixed) // len(WORD_CLASSES))
    words = ("".join(p) for n in (2, 3, 4) for p in itertools.product(SYLLABLES, repeat=n))
    rng = random.Random(1234)
    pool = []
    for w in words:
        pool.append(w)
        if len(pool) >= per_class * len(WORD_CLASSES) * 4:
            break
    rng.shuffle(pool)
    return {cls: sorted(pool[i * per_class:(i + 1) * per_class]) for i, cls in enumerate(WORD_CLASSES)}


@dataclass(frozen=True)
class Tokenizer:
    """Whitespace word-level tokenizer: specials, function words, numbers, the lexicon, then reserved ids."""

    words: tuple[str, ...]

    @classmethod
    @cache
    def for_vocab(cls, vocab: int) -> Tokenizer:
        lexicon = _lexicon(vocab)
        known = list(SPECIALS) + list(FUNCTION_WORDS) + [str(i) for i in range(2 * MAX_NUMBER + 1)]
        known += [w for cls_ in WORD_CLASSES for w in lexicon[cls_]]
        known = known[:vocab]
        return cls(tuple(known + [f"<reserved_{i}>" for i in range(vocab - len(known))]))

    @property
    def vocab(self) -> int:
        return len(self.words)

    @property
    def index(self) -> dict[str, int]:
        return _index(self.words)

    def encode(self, text: str) -> list[int]:
        unk = self.index["<unk>"]
        return [self.index.get(w, unk) for w in text.split()]

    def decode(self, ids: list[int]) -> str:
        return " ".join(self.words[i] for i in ids)


@cache
def _index(words: tuple[str, ...]) -> dict[str, int]:
    return {w: i for i, w in enumerate(words)}


def _zipf_choice(rng: random.Random, items: list[str], weights: list[float]) -> str:
    return rng.choices(items, weights=weights)[0]


def generate_text(vocab: int, corpus: str, sentences: int, seed: int) -> str:
    """``sentences`` sentences of the ``pretrain`` or ``finetune`` corpus, one per line."""
    templates = {"pretrain": PRETRAIN_TEMPLATES, "finetune": FINETUNE_TEMPLATES}[corpus]
    tok = Tokenizer.for_vocab(vocab)
    lexicon = {cls: [w for w in words if w in tok.index] or ["<unk>"] for cls, words in _lexicon(vocab).items()}
    rng = random.Random(f"{corpus}:{seed}")
    # the fine-tuning corpus favours other words: its Zipf ranks run over the lexicon reversed
    order = {cls: (words if corpus == "pretrain" else words[::-1]) for cls, words in lexicon.items()}
    weights = {cls: [1 / (r + 1) ** ZIPF_S for r in range(len(words))] for cls, words in order.items()}
    lines = []
    for _ in range(sentences):
        pick = {cls: _zipf_choice(rng, order[cls], weights[cls]) for cls in WORD_CLASSES}
        a, b = rng.randrange(MAX_NUMBER + 1), rng.randrange(MAX_NUMBER + 1)
        lines.append(rng.choice(templates).format(**pick, name2=_zipf_choice(rng, order["name"], weights["name"]),
                                                  a=a, b=b, sum=a + b))
    return "\n".join(lines)


def token_stream(vocab: int, corpus: str, tokens: int, seed: int) -> torch.Tensor:
    """At least ``tokens`` token ids [tokens] int64: sentences joined by <eos>."""
    tok = Tokenizer.for_vocab(vocab)
    eos = tok.index["<eos>"]
    ids: list[int] = []
    chunk = 0
    while len(ids) < tokens:
        text = generate_text(vocab, corpus, max(64, tokens // 4), seed * 1000 + chunk)
        for line in text.split("\n"):
            ids += tok.encode(line) + [eos]
        chunk += 1
    return torch.tensor(ids[:tokens], dtype=torch.long)


def batches(vocab: int, corpus: str, seq_len: int, batch: int, steps: int, seed: int
            ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` (inputs, targets) pairs, each [batch, seq_len] int64, in a fixed order: consecutive windows of the
    stream, targets shifted by one token."""
    need = steps * batch * (seq_len + 1)
    stream = token_stream(vocab, corpus, need, seed).view(steps, batch, seq_len + 1)
    return [(s[:, :-1].contiguous(), s[:, 1:].contiguous()) for s in stream]
