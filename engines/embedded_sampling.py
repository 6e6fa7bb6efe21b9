"""Per-row sampling for the embedded engine's decoding loop (engines/embedded_decode.py): greedy or
temperature + nucleus by the Gumbel-max trick, each row's noise from its own seeded generator, so a
row's tokens do not depend on its batch neighbours; and stop-string checks."""

from __future__ import annotations

import torch


def row_generator(seed: int | None) -> torch.Generator | None:
    if seed is None:
        return None
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def hits_stop(texts: list[str], i: int, piece: str, stops: tuple[str, ...]) -> bool:
    """Append row i's new text `piece` to `texts[i]`; whether a stop string now ends in it."""
    texts[i] += piece
    tail = texts[i][-(max(map(len, stops)) + len(piece)) :]
    return any(s in tail for s in stops)


def sample_rows(
    logits: torch.Tensor, temps: torch.Tensor, top_ps: torch.Tensor, gens: list[torch.Generator | None]
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row: greedy where T = 0, else temperature + nucleus sampling by the Gumbel-max trick,
    with each row's noise drawn from its own seeded generator (so a row's sample does not depend on the
    other rows of the batch).

    Also returns [rows, V] log-probs of the distribution each row sampled from: log softmax(logits / T),
    -inf outside the nucleus and renormalised over it when top_p < 1; for greedy rows (a degenerate
    distribution) the log-probs of the untempered policy, log softmax(logits)."""
    greedy = temps == 0
    scaled = logits / torch.where(greedy, 1.0, temps)[:, None]
    if bool((top_ps < 1).any()):  # nucleus: keep the smallest set of tokens whose mass reaches top_p
        probs = torch.softmax(scaled, dim=-1)
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        drop_sorted = sorted_p.cumsum(-1) - sorted_p >= top_ps[:, None]
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        scaled = scaled.masked_fill(drop & ~greedy[:, None], float("-inf"))
    # noise drawn on the CPU from each row's generator, whatever the device: a seed samples the same tokens
    u = torch.stack([torch.rand(logits.shape[1], generator=g) for g in gens]).to(logits.device)
    gumbel = -torch.log(-torch.log(u.clamp_min(1e-20)))
    sampled = torch.argmax(scaled + gumbel, dim=-1)
    tokens = torch.where(greedy, torch.argmax(logits, dim=-1), sampled)
    return tokens, torch.log_softmax(scaled, dim=-1)  # greedy rows: scaled is the untempered logits
