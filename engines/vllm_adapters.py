"""Which vLLM LoRA a request of `VLLMEngine` (engines/vllm_engine.py) names, and the adapters it loads.

Each adapter version the registry promotes (serving/registry.py, `adder1@v4`) is a vLLM LoRA of its own;
this module counts versions as the embedded engine does (0 after the first load, +1 per in-place
replacement), salts the prefix cache per version, and serves the base policy through the null adapter:

vLLM 0.32's CPU LoRA kernels index the stacked adapter weights with -1 for a request without an adapter,
which wraps to the LAST adapter slot, so a base request batched with adapter requests silently gets that
slot's adapter once it is filled. The null adapter (rank 1, all zeros, so exactly the base) means every
request carries an adapter and the bug cannot bite. docs/vllm.md, "Two vLLM 0.32 CPU bugs".
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import httpx

from teamtr.engines.vllm_http import VLLMBase, VLLMClient, VLLMRequestError

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


class VLLMAdapters:
    """The adapters loaded through one engine, per base model, and the `model` each request names."""

    def __init__(self, http: VLLMClient, bases: dict[str, VLLMBase], *, null_adapter: bool) -> None:
        self._http = http
        self._bases = bases
        self._use_null_adapter = null_adapter
        self._null_ready: set[str] = set()
        self._null_lock = threading.Lock()
        self.versions: dict[tuple[str, str], int] = {}  # (base, adapter) -> version
        self.paths: dict[tuple[str, str], str] = {}  # (base, adapter) -> the path it was loaded from

    def names(self, base: str) -> list[str]:
        return [name for b, name in self.versions if b == base]

    def version(self, adapter: str, base: str) -> int:
        try:
            return self.versions[(base, adapter)]
        except KeyError:
            raise KeyError(f"unknown adapter {adapter!r} on base {base!r}; have {self.names(base)}") from None

    def salt(self, adapter: str | None, base: str) -> dict:
        """Prefix-cache salt per adapter version: vLLM keys cached blocks by adapter name and path only,
        so after an in-place reload from the same path it would reuse blocks of the old weights."""
        version = self.versions.get((base, adapter)) if adapter is not None else None
        return (
            {}
            if version is None
            else {"cache_salt": f"teamtr-{adapter}-v{version}".replace("/", "_").replace("@", "_")}
        )

    def model_name(self, adapter: str | None, base: str) -> str:
        """The `model` of a request: the adapter's name, else the null adapter (or the base model)."""
        if adapter is not None:
            return adapter
        if self._use_null_adapter:
            self._ensure_null_adapter(base)
            return NULL_ADAPTER
        return self._bases[base].served_model_name

    def _ensure_null_adapter(self, base: str) -> None:
        """Load the all-zero adapter the base policy is served through (once per base)."""
        if base in self._null_ready:
            return
        with self._null_lock:
            if base in self._null_ready:
                return
            spec = self._bases[base]
            path = spec.null_adapter_path or str(null_adapter_dir(spec.tokenizer_path))
            # load_inplace: a server shared with an earlier engine may hold it already
            payload = {"lora_name": NULL_ADAPTER, "lora_path": path, "load_inplace": True}
            self._http.post_sync(spec.url, "/v1/load_lora_adapter", payload, json_body=False)
            self._null_ready.add(base)

    async def load(self, name: str, path: str, base: str) -> None:
        """Load a peft LoRA directory under `name`; if `name` is loaded already, replace it in place
        (`load_inplace`, no unload gap). vLLM reads `path` itself: it must exist on the server's machine."""
        key = (base, name)
        url = self._bases[base].url
        payload: dict[str, Any] = {
            "lora_name": name,
            "lora_path": str(path),
            "load_inplace": key in self.versions,
        }
        try:
            try:
                await self._http.post(url, "/v1/load_lora_adapter", payload)
            except VLLMRequestError as e:
                if payload["load_inplace"] or "already been loaded" not in e.message:
                    raise
                # Loaded on the server by someone else (attached server, earlier engine): replace it.
                await self._http.post(url, "/v1/load_lora_adapter", {**payload, "load_inplace": True})
        except VLLMRequestError as e:  # vLLM hides the path in its message; say which adapter it was
            e.message = f"adapter {name!r} from {path} refused: {e.message}"
            if "max_lora_rank" in e.message:  # vLLM says what is wrong, not what to change
                e.message += (
                    "; start the vLLM server with a --max-lora-rank at least the adapter's rank "
                    "(start_vllm_server(..., max_lora_rank=R)), or train the adapter with a smaller rank"
                )
            e.args = (f"vLLM {e.endpoint} -> HTTP {e.status_code}: {e.message}",)
            raise
        self.versions[key] = self.versions.get(key, -1) + 1
        self.paths[key] = str(path)

    async def unload(self, name: str, base: str) -> None:
        try:
            await self._http.post(self._bases[base].url, "/v1/unload_lora_adapter", {"lora_name": name})
        except VLLMRequestError as e:
            # not there: what the unload wanted. Several API replicas share a vLLM server (docs/scale.md)
            # and each unloads a version once idle there, so another may have unloaded it first
            if e.status_code != 404:
                raise
        self.versions.pop((base, name), None)
        self.paths.pop((base, name), None)

    def knows(self, adapter: str | None, base: str) -> bool:
        """Whether the server should answer to this request's `model`: an adapter loaded through this
        engine, or the null adapter once loaded (a 404 for either means the server lost it)."""
        if adapter is None:
            return base in self._null_ready
        return (base, adapter) in self.paths

    async def restore(
        self, base: str, adapters: dict[str, str] | None = None, *, only_missing: bool = True
    ) -> list[str]:
        """Load again every adapter (`adapters`: name -> path; default: those loaded through this engine)
        the server at `base` does not answer to, as a restarted vLLM server has lost them all; returns
        their names. `only_missing=False` reloads all of them in place (a replica rejoining may hold an
        older file under a name, engines/vllm_replicas.py). Versions do not move (the same files are
        served again); one not known yet counts as a first load (version 0). The null adapter is loaded
        again on the next base request if the server lost it."""
        wanted = adapters if adapters is not None else {n: p for (b, n), p in self.paths.items() if b == base}
        url = self._bases[base].url
        try:
            served = {m["id"] for m in (await self._http.get_json(url, "/v1/models"))["data"]}
        except httpx.HTTPError as e:
            raise VLLMRequestError(0, f"{type(e).__name__}: {e}", "/v1/models") from e
        if NULL_ADAPTER not in served:
            with self._null_lock:
                self._null_ready.discard(base)
        missing = [name for name in wanted if not only_missing or name not in served]
        for name in missing:
            # in place: a concurrent restore may have loaded it since `served` was read
            payload = {"lora_name": name, "lora_path": wanted[name], "load_inplace": True}
            try:
                await self._http.post(url, "/v1/load_lora_adapter", payload)
            except VLLMRequestError as e:  # say which adapter (vLLM hides the path)
                e.message = f"adapter {name!r} from {wanted[name]} refused: {e.message}"
                e.args = (f"vLLM {e.endpoint} -> HTTP {e.status_code}: {e.message}",)
                raise
            self.versions.setdefault((base, name), 0)
            self.paths[(base, name)] = wanted[name]
        return missing
