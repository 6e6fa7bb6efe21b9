"""Named LoRA adapters on one base model of the embedded engine (engines/embedded.py), with peft: create,
load, unload, save, the parameters the trainer optimises, snapshot / restore, and the forward arguments
that give each row of a batch its own adapter."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model

from teamtr.engines.embedded_model import LoadedBase
from teamtr.graphs.engine import LORA_TARGET_MODULES

BASE_ADAPTER = "__base__"  # peft's name for "no adapter" in a mixed-adapter batch


@dataclass
class LoraSettings:
    """LoRA adapters the engine creates for roles (loaded adapters keep their own config)."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: tuple[str, ...] = LORA_TARGET_MODULES

    def peft_config(self) -> LoraConfig:
        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=list(self.target_modules),
            task_type="CAUSAL_LM",
        )


def adapter_version(b: LoadedBase, name: str, base: str) -> int:
    """The live version of `name`; KeyError naming the adapters there are when it is unknown."""
    if name not in b.versions:
        raise KeyError(f"unknown adapter {name!r} on base {base!r}; have {b.adapter_names()}")
    return b.versions[name]


def add_adapter(b: LoadedBase, name: str, config: LoraConfig, base: str) -> None:
    """A fresh LoRA adapter (peft init: B = 0, so it starts exactly equal to the base)."""
    if name in b.versions:
        raise ValueError(f"adapter {name!r} already exists on base {base!r}")
    if b.peft is None:
        b.model = get_peft_model(b.model, config, adapter_name=name)
    else:
        b.peft.add_adapter(name, config)
    _name_base(b, name)
    b.model.eval()
    b.versions[name] = 0


def _name_base(b: LoadedBase, name: str) -> None:
    """Record the base's folder (or hub id) in the adapter's config, which its adapter_config.json keeps
    (`base_model_name_or_path`): peft reads it off the model, where transformers 5 no longer keeps it."""
    config = b.model.peft_config[name]
    if not config.base_model_name_or_path:
        config.base_model_name_or_path = b.path


def load_adapter(b: LoadedBase, name: str, path: str | Path) -> None:
    """Load a peft adapter dir under `name` (replacing an adapter of that name); bumps its version."""
    path = str(path)
    if b.peft is None:
        b.model = PeftModel.from_pretrained(b.model, path, adapter_name=name, is_trainable=False)
    else:
        if name in b.versions:
            b.peft.delete_adapter(name)
        b.peft.load_adapter(path, adapter_name=name, is_trainable=False)
    _name_base(b, name)  # an adapter saved without it (older teamtr) gets the base it is loaded on
    b.model.eval()
    b.versions[name] = b.versions.get(name, -1) + 1


def unload_adapter(b: LoadedBase, name: str) -> None:
    if name not in b.versions:
        raise KeyError(f"unknown adapter {name!r}")
    b.peft.delete_adapter(name)
    del b.versions[name]


def save_adapter(b: LoadedBase, name: str, out_dir: str | Path) -> Path:
    """peft's standard format (adapter_config.json + adapter_model.safetensors) in `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    b.peft.save_pretrained(str(out), selected_adapters=[name], safe_serialization=True)
    nested = out / name  # peft nests non-default adapters in dir/NAME/
    if nested.is_dir():
        for f in nested.iterdir():
            f.replace(out / f.name)
        nested.rmdir()
    return out


def adapter_parameters(b: LoadedBase, name: str) -> dict[str, torch.nn.Parameter]:
    """The LoRA parameters of one adapter (what the trainer optimises for that role)."""
    suffix = f".{name}.weight"
    return {k: p for k, p in b.model.named_parameters() if k.endswith(suffix) and "lora_" in k}


@torch.no_grad()
def restore_adapter(b: LoadedBase, name: str, snapshot: dict[str, torch.Tensor]) -> None:
    """Put exactly these weights back (backtracking a rejected update)."""
    params = adapter_parameters(b, name)
    if set(params) != set(snapshot):
        raise ValueError(f"snapshot does not match adapter {name!r}")
    for k, p in params.items():
        p.copy_(snapshot[k])


@contextmanager
def adapters_for(b: LoadedBase, adapters: list[str | None]) -> Iterator[dict]:
    """Forward kwargs that give each row its own adapter (None = the base / reference). With several
    adapters the kwargs hold `adapter_names`, one per row (the decoding loop narrows it when rows leave)."""
    for a in adapters:
        if a is not None and a not in b.versions:
            raise KeyError(f"unknown adapter {a!r}; have {b.adapter_names()}")
    if b.peft is None:
        yield {}
    elif all(a is None for a in adapters):
        with b.peft.disable_adapter():
            yield {}
    elif len(set(adapters)) == 1:
        b.peft.set_adapter(adapters[0])  # one adapter: plain forward, no per-row dispatch
        yield {}
    else:
        yield {"adapter_names": [BASE_ADAPTER if a is None else a for a in adapters]}
