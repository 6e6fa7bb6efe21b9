"""Exact next-token KL over the whole vocabulary at the positions of sampled messages.

`full_logprobs` gives log pi(. | s, x_<u) at every position of a message, `token_kl_per_message` sums
the exact per-position KL(p || q) over a message's tokens: by the chain rule, with the message sampled
from p, an unbiased estimate of KL(p(m|s) || q(m|s)) with no sampling noise inside a position. Used by
Stage-0 of a role swap (training/swap/stage0.py) and by the trainer's out-of-sample trust-region monitor
(training/diagnostics.py `OutOfSampleKL`).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from teamtr.serving.engines.embedded import EmbeddedEngine


@dataclass
class Side:
    """One model in the divergence: a base of the engine with an adapter (None = the base itself)."""

    engine: EmbeddedEngine
    base: str
    adapter: str | None

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer(self.base)


def full_logprobs(
    side: Side, prompts: list[list[int]], completions: list[list[int]], temperature: float = 1.0
) -> torch.Tensor:
    """[M, T, V] log pi(. | prompt, x_<u) at each completion position (right-padded to T; grads on);
    at `temperature` T != 1 those of pi_T = softmax(logits / T)."""
    model = side.engine.model(side.base)
    pad = side.tokenizer.pad_token_id
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    peft = hasattr(model, "disable_adapter")
    if peft and side.adapter is None:
        ctx = model.disable_adapter()
    else:
        if peft:
            model.set_adapter(side.adapter)
        ctx = nullcontext()
    with ctx:
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    t_max = max(len(c) for c in completions)
    out = logp.new_zeros((len(seqs), t_max, logp.shape[-1]))
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        out[i, : len(c)] = logp[i, len(p) - 1 : len(p) - 1 + len(c)]
    return out


def completion_mask(completions: list[list[int]], width: int) -> torch.Tensor:
    """[M, width] 1 on each completion's tokens (the positions full_logprobs fills)."""
    mask = torch.zeros((len(completions), width))
    for i, c in enumerate(completions):
        mask[i, : len(c)] = 1
    return mask


def token_kl_per_message(p_logp: torch.Tensor, q_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[M] sum over a message's positions of the exact next-token KL(p || q), summed over the vocabulary:
    the chain-rule decomposition of KL(p(m|s) || q(m|s)) at prefixes sampled from p. p_logp, q_logp are
    [M, T, V] log-probs (full_logprobs), mask [M, T] marks real positions. Used by Stage-0 (swap.py) and by
    the trainer's out-of-sample trust-region monitor (training/diagnostics.py)."""
    kl_tok = (p_logp.exp() * (p_logp - q_logp)).sum(-1)  # exact KL(p || q) at each position
    return (kl_tok * mask).sum(-1)  # token-decomposed: sum over the message's tokens


@dataclass
class MessageKL:
    """Per-message exact KLs between two weight sets of one adapter, at messages sampled from p (pi_cur)."""

    forward: torch.Tensor  # [M] sum_u KL(p(.|s,x_<u) || q(.|s,x_<u)): eq. 11's direction, exact
    reverse: torch.Tensor  # [M] sum_u KL(q || p) at the same prefixes: charges mass q puts where p had little
    tokens: torch.Tensor  # [M] completion tokens of each message

    def of(self, direction: str) -> torch.Tensor:
        """[M] the KL a trust region constrains: "forward", "reverse", or "max" (the larger, per message)."""
        if direction == "forward":
            return self.forward
        if direction == "reverse":
            return self.reverse
        if direction == "max":
            return torch.maximum(self.forward, self.reverse)
        raise ValueError(f"unknown KL direction {direction!r} (forward, reverse, max)")


def message_kl(
    side: Side,
    prompts: list[list[int]],
    completions: list[list[int]],
    p_weights: dict[str, torch.Tensor],
    temperature: float = 1.0,
    chunk: int = 8,
) -> MessageKL:
    """Exact per-message KLs between p = the adapter at `p_weights` and q = the adapter as it is now.

    Without gradients; the adapter holds q's weights again when this returns. At most `chunk` messages'
    log-probs are held at once."""
    q_weights = side.engine.snapshot_adapter(side.adapter, side.base)
    forward, reverse = [], []
    with torch.no_grad():
        for s in range(0, len(prompts), chunk):
            ps, cs = prompts[s : s + chunk], completions[s : s + chunk]
            q = full_logprobs(side, ps, cs, temperature)
            side.engine.restore_adapter(side.adapter, p_weights, side.base)
            try:
                p = full_logprobs(side, ps, cs, temperature)
            finally:
                side.engine.restore_adapter(side.adapter, q_weights, side.base)
            mask = completion_mask(cs, p.shape[1])
            forward.append(token_kl_per_message(p, q, mask))
            reverse.append(token_kl_per_message(q, p, mask))
    empty = torch.zeros(0)
    return MessageKL(
        forward=torch.cat(forward) if forward else empty,
        reverse=torch.cat(reverse) if reverse else empty,
        tokens=torch.tensor([len(c) for c in completions], dtype=torch.float32),
    )
