"""One base model of the embedded engine (engines/embedded.py): weights, tokenizer, EOS ids, adapter
versions, loaded with transformers on a chosen device and dtype."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedModel, PreTrainedTokenizerFast

from teamtr.engines.models import ModelReferenceError, resolve_model


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """The fast tokenizer saved beside the model, never AutoTokenizer's guess (docs/serving.md, "The code")."""
    tok = PreTrainedTokenizerFast.from_pretrained(str(path))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def set_torch_threads(threads: int | None) -> None:
    threads = threads or int(os.environ.get("TEAMTR_TORCH_THREADS", "0") or 0)
    if threads > 0:
        torch.set_num_threads(threads)


def eos_token_ids(path: str, tokenizer: PreTrainedTokenizerFast, model: PreTrainedModel) -> frozenset[int]:
    """Every id that ends a message: the tokenizer's EOS and each EOS the generation config lists (chat
    models often end a turn with a token other than the tokenizer's EOS, e.g. <|eot_id|> in Llama 3)."""
    ids = {tokenizer.eos_token_id}
    try:
        configured = GenerationConfig.from_pretrained(path).eos_token_id
    except (OSError, ValueError):  # no generation_config.json: the model config's own
        configured = getattr(model.generation_config, "eos_token_id", None)
    ids.update(configured if isinstance(configured, list | tuple) else [configured])
    return frozenset(i for i in ids if i is not None)


class LoadedBase:
    """One base model with its tokenizer, its peft wrapper (once it has adapters) and adapter versions."""

    def __init__(self, reference: str | Path, dtype: torch.dtype, device: torch.device) -> None:
        self.reference = str(reference)
        self.path = resolve_model(reference, progress=True).path  # a folder, a hub id, or a prepared GGUF
        try:
            self.model: PreTrainedModel | PeftModel = AutoModelForCausalLM.from_pretrained(self.path, dtype=dtype)
            self.tokenizer = load_tokenizer(self.path)
        except (OSError, ValueError) as e:  # a hub id not on the hub / no hub reachable, a folder without weights
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ModelReferenceError(
                f"model {self.reference!r} could not be loaded ({reason}); give a local Hugging Face folder, "
                "a .gguf file, or a hub id reachable from this machine"
            ) from e
        self.model.to(device)
        self.model.eval()
        self.device = device
        self.eos_ids = eos_token_ids(self.path, self.tokenizer, self.model)
        self.versions: dict[str, int] = {}  # adapter name -> version (engines/embedded_adapters.py)
        self.pieces: dict[int, str] = {}  # token id -> its decoded text, for stop strings
        # transformers >= 5.2x calls the KV cache `cache`; earlier releases `past_key_values`
        forward_args = inspect.signature(type(self.model).forward).parameters
        self.cache_kwarg = "cache" if "cache" in forward_args else "past_key_values"

    @property
    def peft(self) -> PeftModel | None:
        return self.model if isinstance(self.model, PeftModel) else None

    def adapter_names(self) -> list[str]:
        return list(self.versions)

    def piece(self, token: int) -> str:
        """Decoded text of one token, cached (stop strings are checked on every sampled token)."""
        piece = self.pieces.get(token)
        if piece is None:
            piece = self.pieces[token] = self.tokenizer.decode([token], skip_special_tokens=True)
        return piece
