"""Exact next-token KL over the whole vocabulary at the positions of sampled messages.

`message_kl` / `message_divergences` give the exact per-message KLs between two weight sets of one adapter,
chunked by positions (engines/embedded_scoring.py's pieces: the body's hidden states at completion
positions only, the LM head and both log-softmaxes a chunk of positions at a time), so no [M, T, V] tensor
exists for a batch: the trainer's paths (the enforced trust region, training/diagnostics.py `OutOfSampleKL`).
`full_logprobs` gives log pi(. | s, x_<u) at every completion position as one [M, T, V] tensor (prompt
positions never reach the LM head), `token_kl_per_message` sums the exact per-position KL(p || q) over a
message's tokens: by the chain rule, with the message sampled from p, an unbiased estimate of
KL(p(m|s) || q(m|s)) with no sampling noise inside a position. Used by Stage-0 of a role swap
(training/swap/stage0.py), whose mixture target needs the whole distributions.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from teamtr.engines.embedded_scoring import (
    LOGIT_CHUNK_BYTES,
    CompletionStates,
    completion_states,
    in_chunks,
    position_chunk,
)
from teamtr.graphs.engine import TrainableEngine

# the KL holds several [chunk, V] float32 tensors at once (two log-softmaxes, their exps, differences)
KL_CHUNK_BYTES = LOGIT_CHUNK_BYTES // 4


@dataclass
class Side:
    """One model in the divergence: a base of the engine with an adapter (None = the base itself)."""

    engine: TrainableEngine
    base: str
    adapter: str | None

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer(self.base)

    def states(
        self, prompts: list[list[int]], completions: list[list[int]], checkpoint_body: bool = False
    ) -> CompletionStates:
        """The body's last hidden states at the completion positions under this side's weights (grads on
        when enabled; `checkpoint_body`: its layers checkpointed, where enabled on the model). Call it
        inside `active()`, and apply the LM head there too."""
        return completion_states(
            self.engine.model(self.base), self.tokenizer.pad_token_id, prompts, completions,
            checkpoint_body=checkpoint_body,
        )

    @contextmanager
    def active(self) -> Iterator[None]:
        """This side's adapter (or none) is the one the model applies."""
        model = self.engine.model(self.base)
        if not hasattr(model, "disable_adapter"):
            yield
        elif self.adapter is None:
            with model.disable_adapter():
                yield
        else:
            model.set_adapter(self.adapter)
            yield


def full_logprobs(
    side: Side, prompts: list[list[int]], completions: list[list[int]], temperature: float = 1.0
) -> torch.Tensor:
    """[M, T, V] log pi(. | prompt, x_<u) at each completion position (right-padded to T; grads on);
    at `temperature` T != 1 those of pi_T = softmax(logits / T)."""
    with side.active():
        s = side.states(prompts, completions)
        head = s.head

        def logp(h: torch.Tensor) -> torch.Tensor:
            return torch.log_softmax(head.logits(h, temperature), dim=-1)

        vocab = head.module.weight.shape[0]
        rows = in_chunks(logp, len(s.targets), position_chunk(vocab), s.hidden) if len(s.targets) else []
    flat = torch.cat(rows) if rows else s.hidden.new_zeros((0, vocab), dtype=torch.float32)
    t_max = max(s.lengths)
    out = flat.new_zeros((len(prompts), t_max, vocab))
    pos = torch.cat([torch.arange(n) for n in s.lengths]).to(flat.device)
    return out.index_put((s.message_index(), pos), flat)


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


def position_divergences(p: CompletionStates, q: CompletionStates, temperature: float = 1.0) -> torch.Tensor:
    """[N, 3] at each completion position: exact KL(p || q), exact KL(q || p) (sums over the vocabulary) and
    log q - log p of the sampled token, a chunk of positions at a time (never all positions' [N, V])."""

    def parts(hp: torch.Tensor, hq: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        lp = torch.log_softmax(p.head.logits(hp, temperature), dim=-1)
        lq = torch.log_softmax(q.head.logits(hq, temperature), dim=-1)
        diff = lp - lq
        forward = (lp.exp() * diff).sum(-1)
        reverse = -(lq.exp() * diff).sum(-1)
        return torch.stack([forward, reverse, -diff.gather(-1, t[:, None]).squeeze(-1)], dim=-1)

    n = len(p.targets)
    if n == 0:
        return torch.zeros((0, 3), device=p.hidden.device)
    chunk = position_chunk(p.head.module.weight.shape[0], KL_CHUNK_BYTES)
    return torch.cat(in_chunks(parts, n, chunk, p.hidden, q.hidden, p.targets))


def message_sums(p: CompletionStates, q: CompletionStates, temperature: float = 1.0) -> torch.Tensor:
    """[M, 3] `position_divergences` summed over each message's positions (differentiable where q is)."""
    sums = torch.zeros((len(p.lengths), 3), device=p.hidden.device)
    return sums.index_add(0, p.message_index(), position_divergences(p, q, temperature))


Messages = list[list[int]]
Weights = dict[str, torch.Tensor]


def message_divergences(
    side: Side,
    prompts: Messages,
    completions: Messages,
    before: Weights,
    t: float = 1.0,
    chunk: int = 8,
    before_states: list[CompletionStates] | None = None,
) -> tuple[MessageKL, torch.Tensor]:
    """`message_kl`'s KLs (p = the adapter at weights `before`, q = as it is now, both pi_T at temperature
    `t`) and, per message, sum_u log q(x_u) - log p(x_u) of its sampled tokens ([M]), from the same forward
    passes. Without gradients; the adapter holds q's weights again when this returns. `chunk` messages'
    hidden states at a time; the vocabulary a chunk of positions at a time.

    `before_states`: p's hidden states, one entry per chunk, kept between calls on the same messages and
    `before` (a list filled by the first call): p never moves while an update is checked again and again,
    so its body passes run once (half of every later check). The LM head is applied at call time, as
    without the list, so the KLs are bit-identical either way."""
    q_weights: Weights | None = None
    per_message: list[torch.Tensor] = []
    with torch.no_grad(), side.active():
        for i, s in enumerate(range(0, len(prompts), chunk)):
            ps, cs = prompts[s : s + chunk], completions[s : s + chunk]
            q = side.states(ps, cs)
            if before_states is not None and i < len(before_states):
                p = before_states[i]
            else:
                if q_weights is None:
                    q_weights = side.engine.snapshot_adapter(side.adapter, side.base)
                side.engine.restore_adapter(side.adapter, before, side.base)
                try:
                    p = side.states(ps, cs)
                finally:
                    side.engine.restore_adapter(side.adapter, q_weights, side.base)
                if before_states is not None:
                    before_states.append(p)
            per_message.append(message_sums(p, q, t).cpu())
    sums = torch.cat(per_message) if per_message else torch.zeros((0, 3))
    kl = MessageKL(
        forward=sums[:, 0],
        reverse=sums[:, 1],
        tokens=torch.tensor([len(c) for c in completions], dtype=torch.float32),
    )
    return kl, sums[:, 2]


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
    hidden states are held at once, and the vocabulary-wide log-probs of a chunk of positions."""
    return message_divergences(side, prompts, completions, p_weights, temperature, chunk)[0]
