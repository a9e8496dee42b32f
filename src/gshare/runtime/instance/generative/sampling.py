"""Choosing the next token from a sequence's logits: greedy, or sampled with temperature and
nucleus (top-p) truncation.

Who calls it: ``causal_lm.CausalLM.prefill`` / ``decode`` once per sequence per step (user
step-wise handlers may use it too).

Reproducibility: a sampled token is drawn from a generator seeded by ``(seed, position)`` —
the sequence's seed and the token's position in it — not from a generator that lives across
steps. A sequence therefore gets the same tokens whatever it was batched with, and after a
preemption whose KV was recomputed (nothing to carry over but its tokens).
"""

from __future__ import annotations

import torch

from gshare.runtime.instance.generative.contract import GenerationParams

_SEED_MIX = 1_000_003


def pick_token(logits: torch.Tensor, params: GenerationParams, position: int) -> int:
    """The next token from ``logits`` ([vocab], any float dtype) for the token at ``position``
    (``len(token_ids)`` before it is appended). Greedy when ``params.temperature`` is 0."""
    if params.greedy:
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass of the tokens ranked above
        sorted_p = torch.where(before < params.top_p, sorted_p, torch.zeros_like(sorted_p))
        probs = torch.zeros_like(probs).scatter(0, order, sorted_p)
    seed = (params.seed or 0) * _SEED_MIX + position
    g = torch.Generator().manual_seed(seed & 0x7FFF_FFFF_FFFF_FFFF)
    return int(torch.multinomial(probs, 1, generator=g).item())


__all__ = ["pick_token"]
