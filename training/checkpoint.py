"""Run-directory files that survive `kill -9`: versioned peft adapters and the resume checkpoint.

    RUN_DIR/adapters/<adapter>/v<version>/adapter_config.json + adapter_model.safetensors   (peft format)
    RUN_DIR/checkpoints/step-<n>/    state.json, adapters.safetensors, optim.pt, rng.pt, batches/
    RUN_DIR/checkpoints/LATEST       the name of the newest complete checkpoint

Every directory is written under a temporary name and renamed into place, and LATEST is replaced
atomically last, so a kill at any moment leaves the previous complete checkpoint in charge.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from teamtr.graphs.trajectory import Trajectory, load_jsonl, save_jsonl

CHECKPOINTS = "checkpoints"
# the current stage's pi^0 weights in a checkpoint (not Stage-0 of a swap); "stage0/" in older checkpoints
STAGE_START = ("stage_start/", "stage0/")
# the best validated stage's weights (eval.keep_best, training/stage_safety.py)
BEST_STAGE = "best_stage/"
LATEST = "LATEST"


def save_peft_adapter(peft_model, adapter_name: str, out_dir: str | Path) -> Path:
    """Write one named adapter in peft's standard layout (loadable with `load_adapter` / vLLM)."""
    from peft import get_peft_model_state_dict

    out_dir = Path(out_dir)
    if out_dir.exists():
        return out_dir  # written before an interruption; the same version has the same weights
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    state = get_peft_model_state_dict(peft_model, adapter_name=adapter_name)
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, tmp / "adapter_model.safetensors")
    peft_model.peft_config[adapter_name].save_pretrained(str(tmp))
    os.replace(tmp, out_dir)
    return out_dir


@dataclass
class Checkpoint:
    """What a resumed run needs to continue exactly where the last completed update left it."""

    state: dict[str, Any]  # position (stage, update), betas, counters, eval history, ...
    adapters: dict[str, dict[str, torch.Tensor]]  # role -> trainable tensors
    optimizers: dict[str, dict[str, Any]]  # role -> optimizer.state_dict()
    rng: dict[str, Any]
    batches: dict[str, list[Trajectory]]  # this stage's rollout batches, by key


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(run_dir: str | Path, step: int, ckpt: Checkpoint, keep: int = 2) -> Path:
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f"step-{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    (tmp / "state.json").write_text(json.dumps(ckpt.state, indent=1))
    flat = {
        f"{role}::{name}": t.detach().contiguous().cpu()
        for role, ts in ckpt.adapters.items()
        for name, t in ts.items()
    }
    save_file(flat, tmp / "adapters.safetensors")
    torch.save(ckpt.optimizers, tmp / "optim.pt")
    torch.save(ckpt.rng, tmp / "rng.pt")
    (tmp / "batches").mkdir()
    for key, trajectories in ckpt.batches.items():
        save_jsonl(trajectories, tmp / "batches" / f"{key}.jsonl")
    _fsync_dir(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    pointer = root / (LATEST + ".tmp")
    pointer.write_text(final.name)
    os.replace(pointer, root / LATEST)
    older = sorted(
        p for p in root.glob("step-*") if p.is_dir() and p != final and not p.name.endswith(".tmp")
    )
    for old in older[: max(len(older) - (keep - 1), 0)]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_latest_checkpoint(run_dir: str | Path) -> Checkpoint | None:
    root = Path(run_dir) / CHECKPOINTS
    if not (root / LATEST).exists():
        return None
    path = root / (root / LATEST).read_text().strip()
    state = json.loads((path / "state.json").read_text())
    adapters: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in load_file(path / "adapters.safetensors").items():
        role, name = key.split("::", 1)
        adapters.setdefault(role, {})[name] = tensor
    optimizers = torch.load(path / "optim.pt", weights_only=False)
    rng = torch.load(path / "rng.pt", weights_only=False)
    batches = {p.stem: list(load_jsonl(p)) for p in sorted((path / "batches").glob("*.jsonl"))}
    return Checkpoint(state=state, adapters=adapters, optimizers=optimizers, rng=rng, batches=batches)


def _fsync_dir(path: Path) -> None:
    for p in path.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
