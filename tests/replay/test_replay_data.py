"""The replay corpus, tokenizer and batches: deterministic, the full vocabulary, a shifted fine-tuning corpus."""

from __future__ import annotations

import math
from collections import Counter

import torch

from workbench.replay.data import SPECIALS, Tokenizer, batches, generate_text, token_stream


def test_the_tokenizer_has_exactly_the_vocabulary_and_round_trips():
    tok = Tokenizer.for_vocab(512)
    assert tok.vocab == 512 and len(set(tok.words)) == 512
    assert tok.words[:len(SPECIALS)] == SPECIALS
    text = generate_text(512, "pretrain", 20, seed=3)
    for line in text.splitlines():
        ids = tok.encode(line)
        assert tok.index["<unk>"] not in ids
        assert tok.decode(ids) == line


def test_a_large_vocabulary_is_filled_with_lexicon_words_not_just_reserved_ids():
    tok = Tokenizer.for_vocab(32768)
    reserved = sum(w.startswith("<reserved_") for w in tok.words)
    assert tok.vocab == 32768 and reserved < 0.01 * tok.vocab


def test_corpora_are_deterministic_and_the_fine_tuning_corpus_is_shifted():
    assert generate_text(512, "pretrain", 50, 0) == generate_text(512, "pretrain", 50, 0)
    assert generate_text(512, "pretrain", 50, 0) != generate_text(512, "pretrain", 50, 1)
    pre = Counter(token_stream(512, "pretrain", 20_000, 0).tolist())
    fine = Counter(token_stream(512, "finetune", 20_000, 0).tolist())
    top_pre = {t for t, _ in pre.most_common(40)}
    top_fine = {t for t, _ in fine.most_common(40)}
    assert len(top_pre & top_fine) < 30  # other templates, other favourite words
    # a real distribution: many distinct tokens, far from uniform (something to learn below ln V)
    entropy = -sum(c / 20_000 * math.log(c / 20_000) for c in pre.values())
    assert len(pre) > 200 and entropy < math.log(512) - 1


def test_batches_are_fixed_windows_with_targets_shifted_by_one():
    data = batches(512, "pretrain", seq_len=16, batch=2, steps=3, seed=0)
    assert len(data) == 3
    for tokens, targets in data:
        assert tokens.shape == targets.shape == (2, 16) and tokens.dtype == torch.long
        assert torch.equal(tokens[:, 1:], targets[:, :-1])
    again = batches(512, "pretrain", seq_len=16, batch=2, steps=3, seed=0)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(data, again, strict=True))
