"""`VLLMEngine`: the Engine interface over real vLLM OpenAI-compatible servers with runtime LoRA.

One vLLM server per base model (heterogeneous teams use several); the engine maps base name -> server.
A role's adapter is a LoRA served under its own name, so a request's `model` is the adapter name; the
reference policy (adapter None) is served through the null adapter below.

Exactness, nothing re-tokenised:
- prompts go to `/v1/completions` as TOKEN IDS, and `return_tokens_as_token_ids` makes the server
  report each sampled token as `token_id:N`, so completion ids and their log-probs come back as sampled;
- the server runs with `--logprobs-mode processed_logprobs` (see vllm_server.LOGPROBS_MODE): the log-probs
  of the distribution each token was sampled from, after temperature and top-p (renormalised over the
  nucleus), as `Generation.logprobs` promises (graphs/engine.py SamplingParams); greedy requests
  (T = 0) get those of the untempered policy, so they are sent with top_p = 1 (the argmax is the same);
- `score` echoes prompt + completion with temperature 1 and reads the prompt log-probs back.

The base policy goes through a "null" adapter (rank 1, all zeros, so exactly the base): vLLM 0.32's CPU
LoRA kernels index the stacked adapter weights with -1 for a request without an adapter, which wraps
to the LAST adapter slot, so a base request batched with adapter requests silently gets that slot's
adapter once it is filled. With every request carrying an adapter the bug cannot bite. Set
`null_adapter=False` on a CUDA server (its kernels skip -1), or when the server is shared with clients
that send base requests themselves (they would still hit the bug on CPU). docs/vllm.md, "Two vLLM 0.32
CPU bugs", has both bugs this module and serving/vllm_server.py work around.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import tempfile
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from teamtr.graphs.engine import DEFAULT_BASE, Generation, SamplingParams
from teamtr.serving.vllm_server import VLLMServer

TOKEN_ID_PREFIX = "token_id:"
NULL_ADAPTER = "teamtr-null-base"  # the served name of the base policy's all-zero adapter


def write_null_adapter(model_dir: str | Path, out_dir: str | Path) -> Path:
    """A peft LoRA directory that changes nothing: rank 1, A = B = 0, on every layer's o_proj (a module
    every Llama/Qwen-style model has). Written from the model config alone, no weights loaded."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model_dir))
    config = getattr(config, "text_config", None) or config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    attention_width = config.num_attention_heads * head_dim
    tensors = {}
    for layer in range(config.num_hidden_layers):
        prefix = f"base_model.model.model.layers.{layer}.self_attn.o_proj"
        tensors[f"{prefix}.lora_A.weight"] = torch.zeros(1, attention_width)
        tensors[f"{prefix}.lora_B.weight"] = torch.zeros(config.hidden_size, 1)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(model_dir),
        "r": 1,
        "lora_alpha": 1,
        "lora_dropout": 0.0,
        "target_modules": ["o_proj"],
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    (out / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2))
    return out


def null_adapter_dir(model_dir: str | Path) -> Path:
    """A stable place for the model's null adapter, shared by every engine on this machine: vLLM rereads
    an adapter from its path after evicting it from its CPU cache, so the files must outlive engines."""
    config_file = Path(model_dir) / "config.json"  # in the key: a model rebuilt in place may change shape
    identity = str(Path(model_dir).resolve()) + (config_file.read_text() if config_file.exists() else "")
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / "teamtr-null-adapters" / key
    if not (out / "adapter_model.safetensors").exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{key}-", dir=out.parent))
        write_null_adapter(model_dir, staging)
        try:
            staging.rename(out)  # atomic: a concurrent engine never sees a half-written adapter
        except OSError:  # another engine won the race; its copy is identical
            shutil.rmtree(staging, ignore_errors=True)
    return out


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


def _error_message(response: httpx.Response) -> str:
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


def _token_id(token: str) -> int:
    if not token.startswith(TOKEN_ID_PREFIX):
        raise ValueError(f"expected a {TOKEN_ID_PREFIX}N token (return_tokens_as_token_ids), got {token!r}")
    return int(token[len(TOKEN_ID_PREFIX) :])


class VLLMEngine:
    """Engine protocol over vLLM servers. `bases` maps base-model name -> server (or `VLLMBase`).

    `max_concurrency` bounds the requests in flight from this engine (per event loop); vLLM batches
    the concurrent ones itself (continuous batching).
    """

    def __init__(
        self,
        bases: Mapping[str, VLLMServer | VLLMBase],
        *,
        max_concurrency: int = 64,
        timeout_s: float = 300.0,
        score_batch: int = 32,
        null_adapter: bool = True,
    ) -> None:
        if not bases:
            raise ValueError("VLLMEngine needs at least one base model -> server")
        self._bases: dict[str, VLLMBase] = {
            name: b if isinstance(b, VLLMBase) else VLLMBase.from_server(b) for name, b in bases.items()
        }
        self._max_concurrency = max_concurrency
        self._score_batch = score_batch
        self._use_null_adapter = null_adapter
        self._null_ready: set[str] = set()
        self._null_lock = threading.Lock()
        self._timeout = httpx.Timeout(timeout_s, connect=10.0)
        self._versions: dict[tuple[str, str], int] = {}
        self._tokenizers: dict[str, Any] = {}
        # An httpx.AsyncClient belongs to the event loop that created it; keep one per loop.
        self._clients: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[httpx.AsyncClient, asyncio.Semaphore]
        ]
        self._clients = weakref.WeakKeyDictionary()
        self._sync_client = httpx.Client(timeout=self._timeout)

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
        return [name for b, name in self._versions if b == base]

    def adapter_version(self, adapter: str | None, base: str = DEFAULT_BASE) -> int:
        """As the embedded engine counts: 0 after the first load, +1 for each in-place replacement
        (0 for the base policy). KeyError for an adapter not loaded through this engine."""
        if adapter is None:
            return 0
        self._base(base)
        try:
            return self._versions[(base, adapter)]
        except KeyError:
            raise KeyError(
                f"unknown adapter {adapter!r} on base {base!r}; have {self.adapters(base)}"
            ) from None

    def _salt(self, adapter: str | None, base: str) -> dict:
        """Prefix-cache salt per adapter version: vLLM keys cached blocks by adapter name and path only,
        so after an in-place reload from the same path it would reuse blocks of the old weights."""
        version = self._versions.get((base, adapter)) if adapter is not None else None
        return (
            {}
            if version is None
            else {"cache_salt": f"teamtr-{adapter}-v{version}".replace("/", "_").replace("@", "_")}
        )

    def tokenizer(self, base: str = DEFAULT_BASE):
        from transformers import PreTrainedTokenizerFast

        if base not in self._tokenizers:
            # Not AutoTokenizer: with a Qwen2-shaped config it silently substitutes another tokenizer.
            self._tokenizers[base] = PreTrainedTokenizerFast.from_pretrained(self._base(base).tokenizer_path)
        return self._tokenizers[base]

    def _model_name(self, adapter: str | None, base: str) -> str:
        if adapter is not None:
            return adapter
        if self._use_null_adapter:
            self._ensure_null_adapter(base)
            return NULL_ADAPTER
        return self._base(base).served_model_name

    def _ensure_null_adapter(self, base: str) -> None:
        """Load the all-zero adapter the base policy is served through (once per base)."""
        if base in self._null_ready:
            return
        with self._null_lock:
            if base in self._null_ready:
                return
            spec = self._base(base)
            path = spec.null_adapter_path or str(null_adapter_dir(spec.tokenizer_path))
            # load_inplace: a server shared with an earlier engine may hold it already
            payload = {"lora_name": NULL_ADAPTER, "lora_path": path, "load_inplace": True}
            self._post_sync(base, "/v1/load_lora_adapter", payload, json_body=False)
            self._null_ready.add(base)

    def _client(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if loop not in self._clients:
            self._clients[loop] = (
                httpx.AsyncClient(timeout=self._timeout),
                asyncio.Semaphore(self._max_concurrency),
            )
        return self._clients[loop]

    async def _post(self, base: str, endpoint: str, payload: dict) -> httpx.Response:
        client, slots = self._client()
        async with slots:
            for attempt in range(TRANSPORT_RETRIES + 1):
                try:
                    response = await client.post(f"{self._base(base).url}{endpoint}", json=payload)
                    break
                except httpx.TransportError as e:  # e.g. a keep-alive connection the server closed
                    if attempt == TRANSPORT_RETRIES:
                        raise VLLMRequestError(0, f"{type(e).__name__}: {e}", endpoint) from e
                    await asyncio.sleep(0.05 * 2**attempt)
                except httpx.HTTPError as e:
                    raise VLLMRequestError(0, f"{type(e).__name__}: {e}", endpoint) from e
        if response.status_code >= 400:
            raise VLLMRequestError(response.status_code, _error_message(response), endpoint)
        return response

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        entry = self._clients.pop(loop, None)
        if entry is not None:
            await entry[0].aclose()

    def close(self) -> None:
        self._sync_client.close()

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
    ) -> Generation:
        if not prompt_ids:
            raise ValueError("prompt_ids is empty")
        # An adapter loaded on the server by someone else (e.g. --lora-modules) is served as version 0.
        version = self._versions.get((base, adapter), 0) if adapter is not None else 0
        payload = self._completion_payload(prompt_ids, self._model_name(adapter, base), sampling)
        payload.update(self._salt(adapter, base))
        body = (await self._post(base, "/v1/completions", payload)).json()
        choice = body["choices"][0]
        lp = choice.get("logprobs") or {}
        completion_ids = [_token_id(t) for t in lp.get("tokens") or []]
        logprobs = [float(x) for x in lp.get("token_logprobs") or []]
        if len(completion_ids) != len(logprobs):
            raise VLLMRequestError(
                200, "vLLM returned different numbers of tokens and log-probs", "/v1/completions"
            )
        return Generation(
            prompt_ids=list(prompt_ids),
            completion_ids=completion_ids,
            logprobs=logprobs,
            text=choice.get("text", ""),
            finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
            adapter=adapter,
            adapter_version=version,
            base_model=base,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            extra={"engine": "vllm", "request_id": body.get("id"), "stop_reason": choice.get("stop_reason")},
        )

    # ---- scoring -----------------------------------------------------------------------------------

    def score(
        self,
        prompts: list[list[int]],
        completions: list[list[int]],
        adapter: str | None,
        base: str = DEFAULT_BASE,
    ) -> list[list[float]]:
        """log pi(x_u | prompt, x_<u) of each completion token: the server echoes prompt + completion
        (`max_tokens=0`, temperature 1, so raw == processed log-probs) with the log-prob of every
        prompt token; sequences go in batches of `score_batch` prompts per request."""
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        if any(not p for p in prompts):
            raise ValueError("every prompt needs at least one token")
        sequences = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
        scores: list[list[float]] = []
        for start in range(0, len(sequences), self._score_batch):
            chunk = sequences[start : start + self._score_batch]
            payload = {
                "model": self._model_name(adapter, base),
                "prompt": chunk,
                "max_tokens": 0,
                "temperature": 1.0,
                "echo": True,
                "logprobs": 0,
                "return_tokens_as_token_ids": True,
                **self._salt(adapter, base),
            }
            choices = sorted(
                self._post_sync(base, "/v1/completions", payload)["choices"], key=lambda c: c["index"]
            )
            for offset, (sequence, choice) in enumerate(zip(chunk, choices, strict=True)):
                lp = choice["logprobs"]
                if [_token_id(t) for t in lp["tokens"][: len(sequence)]] != sequence:
                    raise VLLMRequestError(
                        200, "echoed tokens differ from the tokens sent", "/v1/completions"
                    )
                n_prompt = len(prompts[start + offset])
                scores.append([float(x) for x in lp["token_logprobs"][n_prompt : len(sequence)]])
        return scores

    def _post_sync(self, base: str, endpoint: str, payload: dict, json_body: bool = True) -> Any:
        try:
            response = self._sync_client.post(f"{self._base(base).url}{endpoint}", json=payload)
        except httpx.HTTPError as e:
            raise VLLMRequestError(0, f"{type(e).__name__}: {e}", endpoint) from e
        if response.status_code >= 400:
            raise VLLMRequestError(response.status_code, _error_message(response), endpoint)
        return response.json() if json_body else response.text

    # ---- adapters ----------------------------------------------------------------------------------

    async def load_adapter(self, name: str, path: str, base: str = DEFAULT_BASE) -> None:
        """Load a peft LoRA directory under `name`; if `name` is loaded already, replace it in place
        (`load_inplace`, no unload gap). vLLM reads `path` itself: it must exist on the server's machine."""
        key = (base, name)
        payload: dict[str, Any] = {
            "lora_name": name,
            "lora_path": str(path),
            "load_inplace": key in self._versions,
        }
        try:
            try:
                await self._post(base, "/v1/load_lora_adapter", payload)
            except VLLMRequestError as e:
                if payload["load_inplace"] or "already been loaded" not in e.message:
                    raise
                # Loaded on the server by someone else (attached server, earlier engine): replace it.
                await self._post(base, "/v1/load_lora_adapter", {**payload, "load_inplace": True})
        except VLLMRequestError as e:  # vLLM hides the path in its message; say which adapter it was
            e.message = f"adapter {name!r} from {path} refused: {e.message}"
            if "max_lora_rank" in e.message:  # vLLM says what is wrong, not what to change
                e.message += (
                    "; start the vLLM server with a --max-lora-rank at least the adapter's rank "
                    "(start_vllm_server(..., max_lora_rank=R)), or train the adapter with a smaller rank"
                )
            e.args = (f"vLLM {e.endpoint} -> HTTP {e.status_code}: {e.message}",)
            raise
        self._versions[key] = self._versions.get(key, -1) + 1

    async def unload_adapter(self, name: str, base: str = DEFAULT_BASE) -> None:
        await self._post(base, "/v1/unload_lora_adapter", {"lora_name": name})
        self._versions.pop((base, name), None)

    async def served_models(self, base: str = DEFAULT_BASE) -> list[str]:
        """The names the server answers to: its base model and every loaded adapter."""
        client, _ = self._client()
        response = await client.get(f"{self._base(base).url}/v1/models")
        response.raise_for_status()
        return [m["id"] for m in response.json()["data"]]
