"""`VLLMEngine`: the Engine interface over real vLLM OpenAI-compatible servers with runtime LoRA.

One vLLM server per base model (heterogeneous teams use several); the engine maps base name -> server.
A role's adapter is a LoRA served under its own name, so a request's `model` is the adapter name; the
reference policy (adapter None) is served through a null adapter (engines/vllm_adapters.py).

Exactness, nothing re-tokenised:
- prompts go to `/v1/completions` as TOKEN IDS, and `return_tokens_as_token_ids` makes the server
  report each sampled token as `token_id:N`, so completion ids and their log-probs come back as sampled;
- the server runs with `--logprobs-mode processed_logprobs` (see vllm_server.LOGPROBS_MODE): the log-probs
  of the distribution each token was sampled from, after temperature and top-p (renormalised over the
  nucleus), as `Generation.logprobs` promises (graphs/engine.py SamplingParams); greedy requests
  (T = 0) get those of the untempered policy, so they are sent with top_p = 1 (the argmax is the same);
- `score` echoes prompt + completion with temperature 1 and reads the prompt log-probs back
  (engines/vllm_scoring.py).

The rest is split by job: engines/vllm_http.py (the HTTP client, vLLM's errors and token ids),
engines/vllm_adapters.py (adapter versions, cache salts, the null adapter), engines/vllm_scoring.py.
docs/vllm.md, "Two vLLM 0.32 CPU bugs", has both bugs these modules and engines/vllm_server.py work around.

A restarted vLLM server has lost every runtime-loaded LoRA: a 404 for an adapter this engine loaded
makes it load them all again from their paths (versions unchanged) and resend the request once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from teamtr.engines import vllm_scoring
from teamtr.engines.vllm_adapters import (
    NULL_ADAPTER,
    VLLMAdapters,
    null_adapter_dir,
    write_null_adapter,
)
from teamtr.engines.vllm_http import (
    TOKEN_ID_PREFIX,
    TRANSPORT_RETRIES,
    VLLMBase,
    VLLMClient,
    VLLMRequestError,
    token_id,
)
from teamtr.engines.vllm_http import error_message as _error_message
from teamtr.engines.vllm_server import VLLMServer
from teamtr.graphs.engine import DEFAULT_BASE, Generation, SamplingParams

log = logging.getLogger(__name__)

__all__ = [
    "NULL_ADAPTER",
    "TOKEN_ID_PREFIX",
    "TRANSPORT_RETRIES",
    "VLLMBase",
    "VLLMEngine",
    "VLLMRequestError",
    "_error_message",
    "null_adapter_dir",
    "write_null_adapter",
]


class VLLMEngine:
    """Engine protocol over vLLM servers. `bases` maps base-model name -> server (or `VLLMBase`).

    `max_concurrency` bounds the requests in flight from this engine (per event loop); vLLM batches
    the concurrent ones itself (continuous batching). `restore_lost_adapters`: on a 404 for an adapter
    loaded through this engine, load them all again and resend (off under engines/vllm_replicas.py,
    which takes such a replica out and reloads it before it rejoins).
    """

    streams_tokens = True  # `generate(on_token=...)` streams from vLLM

    def __init__(
        self,
        bases: Mapping[str, VLLMServer | VLLMBase],
        *,
        max_concurrency: int = 64,
        timeout_s: float = 300.0,
        score_batch: int = 32,
        null_adapter: bool = True,
        restore_lost_adapters: bool = True,
    ) -> None:
        if not bases:
            raise ValueError("VLLMEngine needs at least one base model -> server")
        self._bases: dict[str, VLLMBase] = {
            name: b if isinstance(b, VLLMBase) else VLLMBase.from_server(b) for name, b in bases.items()
        }
        self._score_batch = score_batch
        self._http = VLLMClient(max_concurrency=max_concurrency, timeout_s=timeout_s)
        self._adapters = VLLMAdapters(self._http, self._bases, null_adapter=null_adapter)
        self._tokenizers: dict[str, Any] = {}
        self._restore_lost = restore_lost_adapters

    @classmethod
    def single(cls, server: VLLMServer | VLLMBase, base: str = DEFAULT_BASE, **kwargs: Any) -> VLLMEngine:
        return cls({base: server}, **kwargs)

    # ---- bookkeeping -------------------------------------------------------------------------------

    def _base(self, base: str) -> VLLMBase:
        try:
            return self._bases[base]
        except KeyError:
            raise KeyError(f"unknown base model {base!r}; this engine serves {sorted(self._bases)}") from None

    def base_models(self) -> list[str]:
        return list(self._bases)

    def adapters(self, base: str = DEFAULT_BASE) -> list[str]:
        """Adapters loaded through this engine on `base`."""
        return self._adapters.names(base)

    def adapter_version(self, adapter: str | None, base: str = DEFAULT_BASE) -> int:
        """As the embedded engine counts: 0 after the first load, +1 for each in-place replacement
        (0 for the base policy). KeyError for an adapter not loaded through this engine."""
        if adapter is None:
            return 0
        self._base(base)
        return self._adapters.version(adapter, base)

    def tokenizer(self, base: str = DEFAULT_BASE):
        from transformers import PreTrainedTokenizerFast

        if base not in self._tokenizers:
            # Not AutoTokenizer: with a Qwen2-shaped config it silently substitutes another tokenizer.
            self._tokenizers[base] = PreTrainedTokenizerFast.from_pretrained(self._base(base).tokenizer_path)
        return self._tokenizers[base]

    async def aclose(self) -> None:
        await self._http.aclose()

    def close(self) -> None:
        self._http.close()

    # ---- sampling ----------------------------------------------------------------------------------

    def _completion_payload(self, prompt_ids: list[int], model: str, sampling: SamplingParams) -> dict:
        payload: dict[str, Any] = {
            "model": model,
            "prompt": list(prompt_ids),
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            # greedy: the argmax is the same, and the recorded log-probs stay those of pi at T = 1
            "top_p": sampling.top_p if sampling.temperature > 0 else 1.0,
            "logprobs": 0,  # the sampled token's own log-prob only
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": True,
        }
        if sampling.stop:
            payload["stop"] = list(sampling.stop)
            payload["include_stop_str_in_output"] = True  # our convention: the stop string stays in text
        if sampling.seed is not None:
            payload["seed"] = sampling.seed
        return payload

    async def generate(
        self,
        prompt_ids: list[int],
        *,
        adapter: str | None,
        sampling: SamplingParams,
        base: str = DEFAULT_BASE,
        on_token: Callable[[str], None] | None = None,
    ) -> Generation:
        """`on_token`: called with each piece of text as vLLM streams it (the request is then sent with
        `stream: true`; the Generation is the same, assembled from the streamed chunks)."""
        if not prompt_ids:
            raise ValueError("prompt_ids is empty")
        try:
            return await self._generate(prompt_ids, adapter, sampling, base, on_token)
        except VLLMRequestError as e:
            # 404 for an adapter this engine loaded: the server restarted and lost its adapters (a 404
            # comes before any streamed piece, so resending is safe)
            if not self._restore_lost or e.status_code != 404 or not self._adapters.knows(adapter, base):
                raise
            await self.restore_adapters(base)
            return await self._generate(prompt_ids, adapter, sampling, base, on_token)

    async def _generate(
        self,
        prompt_ids: list[int],
        adapter: str | None,
        sampling: SamplingParams,
        base: str,
        on_token: Callable[[str], None] | None,
    ) -> Generation:
        url = self._base(base).url
        # An adapter loaded on the server by someone else (e.g. --lora-modules) is served as version 0.
        version = self._adapters.versions.get((base, adapter), 0) if adapter is not None else 0
        payload = self._completion_payload(prompt_ids, self._adapters.model_name(adapter, base), sampling)
        payload.update(self._adapters.salt(adapter, base))
        # Cancelling this await closes the connection, and vLLM aborts the request (docs/vllm.md).
        if on_token is None:
            body = (await self._http.post(url, "/v1/completions", payload)).json()
            choice = body["choices"][0]
        else:
            body, choice = await self._streamed(url, payload, on_token)
        lp = choice.get("logprobs") or {}
        completion_ids = [token_id(t) for t in lp.get("tokens") or []]
        logprobs = [float(x) for x in lp.get("token_logprobs") or []]
        if len(completion_ids) != len(logprobs):
            raise VLLMRequestError(
                200, "vLLM returned different numbers of tokens and log-probs", "/v1/completions"
            )
        text = choice.get("text", "")
        return Generation(
            prompt_ids=list(prompt_ids),
            completion_ids=completion_ids,
            logprobs=logprobs,
            text=text,
            finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
            adapter=adapter,
            adapter_version=version,
            base_model=base,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            extra={"engine": "vllm", "request_id": body.get("id"), "stop_reason": choice.get("stop_reason")},
        )

    async def _streamed(
        self, url: str, payload: dict, on_token: Callable[[str], None]
    ) -> tuple[dict, dict[str, Any]]:
        """A streamed completion, its pieces passed to `on_token` as they come; returns (body, choice)
        shaped like the non-streamed response's, for `generate` to read the same way."""
        body: dict[str, Any] = {}
        text, tokens, logprobs = [], [], []
        finish, stop_reason = None, None
        async for event in self._http.post_events(url, "/v1/completions", {**payload, "stream": True}):
            body.setdefault("id", event.get("id"))
            for choice in event.get("choices") or ():
                piece = choice.get("text") or ""
                lp = choice.get("logprobs") or {}
                tokens += lp.get("tokens") or []
                logprobs += lp.get("token_logprobs") or []
                finish = choice.get("finish_reason") or finish
                stop_reason = choice.get("stop_reason", stop_reason)
                if piece:
                    text.append(piece)
                    on_token(piece)
        choice = {
            "text": "".join(text),
            "logprobs": {"tokens": tokens, "token_logprobs": logprobs},
            "finish_reason": finish,
            "stop_reason": stop_reason,
        }
        return body, choice

    # ---- scoring (engines/vllm_scoring.py) ---------------------------------------------------------

    def score(
        self,
        prompts: list[list[int]],
        completions: list[list[int]],
        adapter: str | None,
        base: str = DEFAULT_BASE,
    ) -> list[list[float]]:
        """log pi(x_u | prompt, x_<u) of each completion token, `score_batch` sequences per request."""
        url = self._base(base).url

        def request() -> dict:
            return {"model": self._adapters.model_name(adapter, base), **self._adapters.salt(adapter, base)}

        return vllm_scoring.score(self._http, url, request, prompts, completions, self._score_batch)

    # ---- adapters (engines/vllm_adapters.py) -------------------------------------------------------

    async def load_adapter(self, name: str, path: str, base: str = DEFAULT_BASE) -> None:
        """Load a peft LoRA directory under `name`; if `name` is loaded already, replace it in place
        (`load_inplace`, no unload gap). vLLM reads `path` itself: it must exist on the server's machine."""
        self._base(base)
        await self._adapters.load(name, path, base)

    async def restore_adapters(
        self, base: str = DEFAULT_BASE, adapters: dict[str, str] | None = None, *, only_missing: bool = True
    ) -> list[str]:
        """Load again the adapters (default: every one loaded through this engine) the server lost in a
        restart, from the paths they were loaded from; versions stay (engines/vllm_adapters.py `restore`).
        Called on a 404 for a known adapter and by the readiness probe (serving/health.py)."""
        self._base(base)
        restored = await self._adapters.restore(base, adapters, only_missing=only_missing)
        if restored and only_missing:  # (a replica rejoining reloads them all: nothing was lost)
            log.warning(
                "vLLM server %s lost adapters %s (restarted?): loaded again", self._base(base).url, restored
            )
        return restored

    async def unload_adapter(self, name: str, base: str = DEFAULT_BASE) -> None:
        self._base(base)
        await self._adapters.unload(name, base)

    async def served_models(self, base: str = DEFAULT_BASE) -> list[str]:
        """The names the server answers to: its base model and every loaded adapter."""
        return [m["id"] for m in (await self._http.get_json(self._base(base).url, "/v1/models"))["data"]]
