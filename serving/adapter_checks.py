"""Checks a LoRA adapter folder passes before it may go live (serving/registry.py), so that a refused
version never replaces the serving one.

- safetensors only: a directory holding pickle-based weights (.bin, .pt, .pth, .pkl, .ckpt) is refused;
- adapter_config.json is a LoRA config whose rank, target modules and base model match the role's
  first version;
- every tensor parses, is finite, and has exactly the names and shapes of the role's first version.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from teamtr.graphs.run_layout import ADAPTER_CONFIG, ADAPTER_WEIGHTS

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


class AdapterError(ValueError):
    """An adapter was refused; the message says why. The serving version is unchanged."""


class UnknownAdapterError(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0])


def engine_name(adapter: str, version: int) -> str:
    return f"{adapter}@v{version}"


@dataclass(frozen=True)
class AdapterSignature:
    """What must stay the same across versions of one role's adapter."""

    rank: int
    target_modules: tuple[str, ...]
    base_model: str
    shapes: tuple[tuple[str, tuple[int, ...]], ...]


def inspect_adapter(path: str | Path) -> AdapterSignature:
    """Validate one peft LoRA directory on its own; raise AdapterError with the reason."""
    d = Path(path)
    if not d.is_dir():
        raise AdapterError(f"{d}: not a directory")
    pickled = sorted(p.name for p in d.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
    if pickled:
        raise AdapterError(
            f"{d}: refusing pickle-based weight files {pickled}; save adapters with safetensors "
            "(peft's save_pretrained(safe_serialization=True))"
        )
    cfg_path, weights = d / ADAPTER_CONFIG, d / ADAPTER_WEIGHTS
    if not cfg_path.is_file():
        raise AdapterError(f"{d}: missing {ADAPTER_CONFIG}")
    if not weights.is_file():
        raise AdapterError(f"{d}: missing {ADAPTER_WEIGHTS}")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise AdapterError(f"{cfg_path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict) or cfg.get("peft_type") != "LORA":
        raise AdapterError(f"{cfg_path}: not a LoRA adapter config (peft_type must be 'LORA')")
    rank = cfg.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise AdapterError(f"{cfg_path}: rank r must be a positive integer, got {rank!r}")
    targets = cfg.get("target_modules")
    targets = (targets,) if isinstance(targets, str) else tuple(sorted(targets or ()))
    shapes: dict[str, tuple[int, ...]] = {}
    try:
        with safe_open(str(weights), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                tensor = f.get_tensor(key)
                if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                    raise AdapterError(f"{weights}: tensor {key} has NaN or infinite values")
                shapes[key] = tuple(tensor.shape)
    except (SafetensorError, OSError, RuntimeError) as e:
        raise AdapterError(f"{weights}: cannot be read as safetensors ({e})") from None
    if not shapes:
        raise AdapterError(f"{weights}: holds no tensors")
    for key, shape in shapes.items():
        if "lora_A" in key and shape[0] != rank or "lora_B" in key and shape[-1] != rank:
            raise AdapterError(f"{weights}: tensor {key} has shape {shape}, not rank {rank}")
    return AdapterSignature(
        rank=rank,
        target_modules=targets,
        base_model=str(cfg.get("base_model_name_or_path") or ""),
        shapes=tuple(sorted(shapes.items())),
    )


def _same_base(a: str, b: str) -> bool:
    """Base model names match when equal, or when both are paths to the same directory name."""
    if not a or not b or a == b:
        return True
    return Path(a).name == Path(b).name


def check_compatible(reference: AdapterSignature, new: AdapterSignature, where: str) -> None:
    if new.rank != reference.rank:
        raise AdapterError(f"{where}: rank {new.rank} does not match the serving rank {reference.rank}")
    if new.target_modules != reference.target_modules:
        raise AdapterError(
            f"{where}: target modules {list(new.target_modules)} do not match "
            f"{list(reference.target_modules)}"
        )
    if not _same_base(reference.base_model, new.base_model):
        raise AdapterError(
            f"{where}: trained on base model {new.base_model!r}, but this role serves on "
            f"{reference.base_model!r}"
        )
    ref_shapes, new_shapes = dict(reference.shapes), dict(new.shapes)
    if ref_shapes.keys() != new_shapes.keys():
        missing = sorted(ref_shapes.keys() - new_shapes.keys())[:3]
        extra = sorted(new_shapes.keys() - ref_shapes.keys())[:3]
        raise AdapterError(f"{where}: tensor names differ (missing {missing}, unexpected {extra})")
    for key, shape in ref_shapes.items():
        if new_shapes[key] != shape:
            raise AdapterError(
                f"{where}: tensor {key} has shape {new_shapes[key]}, the base model needs {shape}"
            )
