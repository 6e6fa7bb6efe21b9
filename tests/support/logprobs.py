"""The log-probabilities a sampled turn should record, computed independently of the engines
(tests/engines/test_behaviour_logprobs.py and its vLLM twin)."""

from __future__ import annotations

import torch


def expected_logprobs(
    model, prompt: list[int], completion: list[int], temperature: float, top_p: float = 1.0
):
    """log-prob of each completion token under the distribution it was sampled from, in float64:
    softmax(logits / T), restricted to the smallest set of top tokens whose mass reaches top_p and
    renormalised there (greedy, T = 0: the untempered policy)."""
    out = []
    for u, token in enumerate(completion):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + completion[:u]])).logits[0, -1].double()
        logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
        if temperature > 0 and top_p < 1:
            probs, order = torch.sort(logp.exp(), descending=True)
            keep = order[: int((probs.cumsum(0) - probs < top_p).sum())]
            assert token in keep.tolist(), "the sampled token lies outside the nucleus"
            logp = logp - torch.logsumexp(logp[keep], dim=0)
        out.append(float(logp[token]))
    return out

