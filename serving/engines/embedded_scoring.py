"""Exact, differentiable log-probs of given completions on the embedded engine (serving/engines/embedded.py):
the trainer's path, and `Engine.score`."""

from __future__ import annotations

import torch

from teamtr.serving.engines.embedded_adapters import adapters_for
from teamtr.serving.engines.embedded_model import LoadedBase


def token_logprobs(
    b: LoadedBase,
    prompts: list[list[int]],
    completions: list[list[int]],
    adapters: list[str | None],
    temperature: float = 1.0,
) -> list[torch.Tensor]:
    """log pi(x_u | prompt, x_<u) for each completion token, one adapter per sequence, differentiable.
    `temperature` T > 0 gives log pi_T = log softmax(logits / T), what sampling at T records."""
    if temperature <= 0:
        raise ValueError("token_logprobs needs a temperature > 0 (greedy has no log-probs to score)")
    if len(prompts) != len(completions):
        raise ValueError("prompts and completions differ in length")
    if not prompts:
        return []
    pad = b.tokenizer.pad_token_id
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):  # right padding: positions are plain 0..len-1
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    with adapters_for(b, adapters) as kwargs:
        logits = b.model(input_ids=ids.to(b.device), attention_mask=mask.to(b.device), **kwargs).logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits[:, :-1], dim=-1)
    out = []
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        pos = torch.arange(len(p) - 1, len(p) - 1 + len(c), device=b.device)
        out.append(logp[i, pos, torch.tensor(c, dtype=torch.long, device=b.device)])
    return out
