"""`VLLMEngine.score` (engines/vllm_engine.py): log-probs of given completion tokens, read back from a
vLLM server that echoes prompt + completion."""

from __future__ import annotations

from collections.abc import Callable

from teamtr.engines.vllm_http import VLLMClient, VLLMRequestError, token_id


def score(
    http: VLLMClient,
    url: str,
    request: Callable[[], dict],
    prompts: list[list[int]],
    completions: list[list[int]],
    batch: int,
) -> list[list[float]]:
    """log pi(x_u | prompt, x_<u) of each completion token: the server echoes prompt + completion
    (`max_tokens=0`, temperature 1, so raw == processed log-probs) with the log-prob of every prompt
    token; sequences go in batches of `batch` prompts per request. `request()`: the `model` (and cache
    salt) the sequences are scored under, asked once the inputs are known to be valid."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    if any(not p for p in prompts):
        raise ValueError("every prompt needs at least one token")
    sequences = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
    scores: list[list[float]] = []
    for start in range(0, len(sequences), batch):
        chunk = sequences[start : start + batch]
        payload = {
            **request(),
            "prompt": chunk,
            "max_tokens": 0,
            "temperature": 1.0,
            "echo": True,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
        }
        choices = sorted(http.post_sync(url, "/v1/completions", payload)["choices"], key=lambda c: c["index"])
        for offset, (sequence, choice) in enumerate(zip(chunk, choices, strict=True)):
            lp = choice["logprobs"]
            if [token_id(t) for t in lp["tokens"][: len(sequence)]] != sequence:
                raise VLLMRequestError(200, "echoed tokens differ from the tokens sent", "/v1/completions")
            n_prompt = len(prompts[start + offset])
            scores.append([float(x) for x in lp["token_logprobs"][n_prompt : len(sequence)]])
    return scores
