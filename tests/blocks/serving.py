"""Shared by the serving forms' tests: prompts run as packed prefill chunks, then decoded a token per sequence, the
outputs gathered back in the order of the prompts packed whole (what a prefill of them at once returns)."""

from __future__ import annotations

import torch


def chunked_then_decoded(prompts: list[int], chunks: list[list[int]], state, prefill, decode):
    """``prompts`` (tokens per sequence) run as the packed ``chunks`` (tokens per sequence each), then the tokens
    left decoded one per live sequence a step. ``prefill(rows, done, chunk, step, state)`` and ``decode(rows, live,
    done, state)`` return (outputs, state): outputs a tensor or a tuple of tensors, a row per row of ``rows`` (the
    packed rows of the prompts whole; ``done`` the tokens each sequence has had, ``live`` the sequences decoding).
    Returns (every token's outputs in packed order: a tensor, or a tuple where the callbacks give tuples; the final
    state)."""
    starts = [0, *torch.tensor(prompts).cumsum(0).tolist()]
    done, pieces = [0] * len(prompts), [[] for _ in prompts]

    def keep(out, counts):
        parts = [t.split(counts) for t in (out if isinstance(out, tuple) else (out,))]
        for n, count in enumerate(counts):
            pieces[n].append([p[n] for p in parts])
            done[n] += count

    for step, chunk in enumerate(chunks):
        rows = torch.cat([torch.arange(starts[n] + done[n], starts[n] + done[n] + c) for n, c in enumerate(chunk)])
        out, state = prefill(rows, list(done), chunk, step, state)
        keep(out, chunk)
    while any(d < p for d, p in zip(done, prompts, strict=True)):
        live = [n for n in range(len(prompts)) if done[n] < prompts[n]]
        out, state = decode(torch.tensor([starts[n] + done[n] for n in live]), live, list(done), state)
        keep(out, [int(n in live) for n in range(len(prompts))])
    gathered = tuple(torch.cat([piece[i] for seq in pieces for piece in seq]) for i in range(len(pieces[0][0])))
    return (gathered[0] if len(gathered) == 1 else gathered), state
