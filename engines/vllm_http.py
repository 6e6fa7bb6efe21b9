"""The HTTP side of `VLLMEngine` (engines/vllm_engine.py): where a base model's vLLM server is, one
`httpx.AsyncClient` per event loop with a bound on requests in flight, transport retries, vLLM's errors,
and the `token_id:N` tokens that `return_tokens_as_token_ids` answers with; `post_events` reads a
streamed (`stream: true`) response event by event.

A request cancelled while awaiting its response (the API cancels an episode whose client went away)
closes its connection; vLLM's completions endpoint then aborts the request and frees its sequence
(docs/vllm.md, "Cancellation").
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from teamtr.engines.vllm_server import VLLMServer

TOKEN_ID_PREFIX = "token_id:"

# Transport failures (not HTTP errors) are retried: resending is harmless, since completions and scoring
# are stateless and adapter loads are idempotent (load_inplace).
TRANSPORT_RETRIES = 2


class VLLMRequestError(RuntimeError):
    """vLLM refused a request (bad adapter, prompt too long, ...); carries vLLM's own message."""

    def __init__(self, status_code: int, message: str, endpoint: str) -> None:
        super().__init__(f"vLLM {endpoint} -> HTTP {status_code}: {message}")
        self.status_code = status_code
        self.message = message
        self.endpoint = endpoint


@dataclass(frozen=True)
class VLLMBase:
    """One base model served by one vLLM server."""

    url: str  # e.g. http://127.0.0.1:8000
    served_model_name: str  # the `model` of requests to the base policy
    tokenizer_path: str  # a directory (or hub id) PreTrainedTokenizerFast.from_pretrained accepts
    # Where the null adapter is (must be readable by the server); None: written under the temp dir here.
    null_adapter_path: str | None = None

    @classmethod
    def from_server(cls, server: VLLMServer) -> VLLMBase:
        return cls(server.url, server.served_model_name, server.model_dir)


def error_message(response: httpx.Response) -> str:
    """vLLM answers errors as {"error": {"message": ...}} (OpenAI shape), older builds {"message": ...};
    the LoRA endpoints sometimes as plain text."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip() or response.reason_phrase
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if body.get("message"):
            return str(body["message"])
        if isinstance(error, str):
            return error
    return str(body)


def token_id(token: str) -> int:
    if not token.startswith(TOKEN_ID_PREFIX):
        raise ValueError(f"expected a {TOKEN_ID_PREFIX}N token (return_tokens_as_token_ids), got {token!r}")
    return int(token[len(TOKEN_ID_PREFIX) :])


class VLLMClient:
    """POSTs to vLLM servers: async (one client and semaphore per event loop) and blocking (scoring,
    the null adapter's one-off load)."""

    def __init__(self, *, max_concurrency: int, timeout_s: float) -> None:
        self._max_concurrency = max_concurrency
        self._timeout = httpx.Timeout(timeout_s, connect=10.0)
        # An httpx.AsyncClient belongs to the event loop that created it; keep one per loop.
        self._clients: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[httpx.AsyncClient, asyncio.Semaphore]
        ]
        self._clients = weakref.WeakKeyDictionary()
        self._sync_client = httpx.Client(timeout=self._timeout)

    def _client(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if loop not in self._clients:
            self._clients[loop] = (
                httpx.AsyncClient(timeout=self._timeout),
                asyncio.Semaphore(self._max_concurrency),
            )
        return self._clients[loop]

    async def post(self, url: str, endpoint: str, payload: dict) -> httpx.Response:
        client, slots = self._client()
        async with slots:
            for attempt in range(TRANSPORT_RETRIES + 1):
                try:
                    response = await client.post(f"{url}{endpoint}", json=payload)
                    break
                except httpx.TransportError as e:  # e.g. a keep-alive connection the server closed
                    if attempt == TRANSPORT_RETRIES:
                        raise VLLMRequestError(0, f"{type(e).__name__}: {e}", endpoint) from e
                    await asyncio.sleep(0.05 * 2**attempt)
                except httpx.HTTPError as e:
                    raise VLLMRequestError(0, f"{type(e).__name__}: {e}", endpoint) from e
        if response.status_code >= 400:
            raise VLLMRequestError(response.status_code, error_message(response), endpoint)
        return response

    async def post_events(self, url: str, endpoint: str, payload: dict) -> AsyncIterator[dict]:
        """POST a `stream: true` request and yield each server-sent event's JSON, until `[DONE]`.
        Closing the generator (a cancelled caller) closes the connection, and vLLM aborts the request."""
        client, slots = self._client()
        seen = False
        async with slots:
            for attempt in range(TRANSPORT_RETRIES + 1):
                try:
                    async with client.stream("POST", f"{url}{endpoint}", json=payload) as response:
                        if response.status_code >= 400:
                            await response.aread()
                            raise VLLMRequestError(response.status_code, error_message(response), endpoint)
                        async for line in response.aiter_lines():
                            if not line.startswith("data: "):
                                continue
                            data = line[len("data: ") :]
                            if data.strip() == "[DONE]":
                                return
                            seen = True
                            yield json.loads(data)
                    return
                except httpx.TransportError as e:  # retried only before any event went out (nothing seen)
                    if attempt == TRANSPORT_RETRIES or seen:
                        raise VLLMRequestError(0, f"{type(e).__name__}: {e}", endpoint) from e
                    await asyncio.sleep(0.05 * 2**attempt)
                except httpx.HTTPError as e:
                    raise VLLMRequestError(0, f"{type(e).__name__}: {e}", endpoint) from e

    async def get_json(self, url: str, endpoint: str) -> Any:
        client, _ = self._client()
        response = await client.get(f"{url}{endpoint}")
        response.raise_for_status()
        return response.json()

    def post_sync(self, url: str, endpoint: str, payload: dict, json_body: bool = True) -> Any:
        try:
            response = self._sync_client.post(f"{url}{endpoint}", json=payload)
        except httpx.HTTPError as e:
            raise VLLMRequestError(0, f"{type(e).__name__}: {e}", endpoint) from e
        if response.status_code >= 400:
            raise VLLMRequestError(response.status_code, error_message(response), endpoint)
        return response.json() if json_body else response.text

    async def aclose(self) -> None:
        """Close this event loop's client."""
        entry = self._clients.pop(asyncio.get_running_loop(), None)
        if entry is not None:
            await entry[0].aclose()

    def close(self) -> None:
        self._sync_client.close()
