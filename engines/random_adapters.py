"""LoRA adapters that change a model's outputs, and adapter versions written where a run keeps them.

peft starts every LoRA B matrix at zero, so a fresh adapter equals its base. Load tests, benchmarks and
the test suite need adapters that differ from the base (and from each other) and do real work: these
functions draw the B matrices at random, seeded, and save them in the layout the trainer writes
(RUN_DIR/adapters/<adapter>/v<k>/), so a team can be served or pushed without training it first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import torch

from teamtr.engines.embedded import EmbeddedEngine, LoraSettings
from teamtr.graphs.run_layout import adapter_dir

CHAIN_ROLES = ("adder1", "adder2", "adder3")  # the chain team's (graphs/chain_team.py)
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def randomise_lora_b(params: Mapping[str, torch.Tensor], std: float) -> None:
    """Draw every LoRA B matrix among `params` (name -> parameter) from N(0, std), in place."""
    with torch.no_grad():
        for name, param in params.items():
            if "lora_B" in name:
                param.normal_(0.0, std)


def randomise_adapters(engine: EmbeddedEngine, adapters: Iterable[str], std: float, seed: int | None = None) -> None:
    """`randomise_lora_b` on each of an engine's `adapters` in turn, after seeding torch (when `seed`)."""
    if seed is not None:
        torch.manual_seed(seed)
    for adapter in adapters:
        randomise_lora_b(engine.adapter_parameters(adapter), std)


def save_adapters(engine: EmbeddedEngine, run_dir: Path, adapters: Iterable[str], version: int) -> None:
    """RUN_DIR/adapters/<adapter>/v<version>/ for each adapter: the layout the trainer writes."""
    for adapter in adapters:
        engine.save_adapter(adapter, adapter_dir(run_dir, adapter, version))


def write_adapter_versions(
    engine: EmbeddedEngine,
    run_dir: Path,
    versions: Iterable[int],
    adapters: Sequence[str],
    std: float,
    seed: Callable[[int], int] = lambda version: 1000 * version,
) -> Path:
    """Each version k a fresh draw of every adapter's B matrices (torch seeded with `seed(k)`), saved as
    RUN_DIR/adapters/<adapter>/v<k>/; returns run_dir."""
    for version in versions:
        randomise_adapters(engine, adapters, std, seed=seed(version))
        save_adapters(engine, run_dir, adapters, version)
    return Path(run_dir)


def write_versions(
    model_dir: Path,
    run_dir: Path,
    versions: Iterable[int],
    roles: Sequence[str] = CHAIN_ROLES,
    rank: int = 4,
    target_modules: tuple[str, ...] = ("q_proj", "v_proj"),
    scale: float = 0.3,
) -> Path:
    """`write_adapter_versions` for `roles` on a fresh embedded engine of `model_dir`."""
    # peft draws the LoRA A matrices from the global generator: seed it, so a test's adapters do not
    # depend on which tests ran before it
    with torch.random.fork_rng():
        torch.manual_seed(0)
        engine = EmbeddedEngine(
            model_dir,
            adapters={r: None for r in roles},
            threads=1,
            lora=LoraSettings(r=rank, alpha=2 * rank, target_modules=target_modules),
        )
    return write_adapter_versions(engine, run_dir, versions, roles, std=scale)


def random_lora_adapter(
    model_dir: str | Path,
    out_dir: str | Path,
    seed: int,
    rank: int = 8,
    target_modules: Sequence[str] = ALL_LINEAR,
    std: float = 0.5,
) -> Path:
    """A peft LoRA adapter (safetensors) on `model_dir` with random A and B, written by peft itself (no
    engine involved)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(target_modules), task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    randomise_lora_b(dict(peft_model.named_parameters()), std)
    peft_model.save_pretrained(str(out_dir), safe_serialization=True)
    return Path(out_dir)
