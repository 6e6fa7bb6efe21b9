"""The GPU path in one run: the embedded engine on the device, one update of the trainer's log-prob pass
(forward, backward and an optimiser step of a LoRA adapter on the configured model, peak CUDA memory), a
vLLM server with two role LoRAs and a hot-swap, and one TeamTR stage whose rollouts vLLM samples; prints
what it measured as one JSON object.

    .venv/bin/python scripts/gpu_check.py --device cuda            # bfloat16 on the first GPU
    .venv/bin/python scripts/gpu_check.py --device cpu --no-vllm   # the dry run (tests/project/test_gpu_check.py)

scripts/gpu_check.sh installs the CUDA vLLM first and keeps the whole run under 8 minutes. Measured:
tokens per second (embedded, vLLM), the log-prob gap between what vLLM recorded and what the trainer's
engine computes for the same tokens and adapter (the off-policy error of vLLM rollouts; bfloat16 on both
sides on a GPU, so larger than the ~1e-6 of float32 on CPU), and hot-swap failures: a push that raised,
or a sample after it whose log-probs are closer to the replaced adapter's than to the new one's.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from teamtr.engines.embedded import EmbeddedEngine, LoraSettings
from teamtr.graphs.engine import LORA_TARGET_MODULES, SamplingParams

PROMPTS = ["3+4+5", "1+2+3", "9+8+7", "2+6+1", "5+5+5", "7+1+4", "4+4+2", "8+3+6"]

# Architectures the update check can build with random weights (`--shape`): an update's memory does not
# depend on the weights' values, so a machine with no hub measures the model a user will train.
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-8b": {  # Qwen/Qwen3-8B's config.json: 8.19 B parameters, untied embedding and LM head
        "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
        "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    },
    "qwen3-tiny": {  # the same architecture at test size (tests/project/test_gpu_check.py)
        "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "max_position_embeddings": 2048, "tie_word_embeddings": False,
    },
}  # fmt: skip


def default_model() -> str:
    """The demo's shipped warm model (a tiny Llama over characters: every check runs on it anywhere)."""
    from teamtr.training.warmstart import warm_config_for
    from teamtr.training.warmstart.shipped import DEMO_WARM_OVERRIDES, shipped_model

    path = shipped_model(warm_config_for("chain", **DEMO_WARM_OVERRIDES))
    if path is None:
        raise SystemExit("no shipped demo model in this install: pass --model")
    return str(path)


def random_model(shape: str, out_dir: Path, device: str, tokenizer_from: str) -> str:
    """A model folder of architecture SHAPES[shape] with random bfloat16 weights (initialised on `device`, so
    an 8B model takes seconds on a GPU) and `tokenizer_from`'s tokenizer (the update draws random token ids
    from the model's own vocabulary, so which tokenizer does not matter)."""
    import gc

    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    settings = dict(SHAPES[shape])
    config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(str(out_dir))
    AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(str(out_dir))
    del model
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return str(out_dir)


def random_lora(model_dir: str, out_dir: Path, seed: int, rank: int) -> Path:
    """A peft LoRA adapter on `model_dir` with random A and B (B = 0 would equal the base)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=list(LORA_TARGET_MODULES), task_type="CAUSAL_LM"
    )
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5 / rank**0.5)
    peft_model.save_pretrained(str(out_dir), safe_serialization=True)
    return out_dir


async def generate_all(engine: Any, prompts: list[list[int]], adapter: str | None, sampling: SamplingParams):
    return await asyncio.gather(
        *(
            engine.generate(p, adapter=adapter, sampling=dataclasses.replace(sampling, seed=i))
            for i, p in enumerate(prompts)
        )
    )


def throughput(engine: Any, prompts: list[list[int]], adapter: str | None, new_tokens: int) -> dict:
    """Concurrent sampled generations of up to `new_tokens` each (tokens/s counts those generated)."""
    sampling = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)
    asyncio.run(generate_all(engine, prompts[:1], adapter, SamplingParams(temperature=1.0, max_new_tokens=2)))
    t0 = time.perf_counter()
    gens = asyncio.run(generate_all(engine, prompts, adapter, sampling))
    seconds = time.perf_counter() - t0
    tokens = sum(len(g.completion_ids) for g in gens)
    return {"sequences": len(gens), "tokens": tokens, "seconds": round(seconds, 3),
            "tokens_per_s": round(tokens / max(seconds, 1e-9), 1)}  # fmt: skip


def logprob_gap(trainer: EmbeddedEngine, gens: list, adapter: str, temperature: float) -> dict:
    """|recorded - trainer's| per token for `gens` under `adapter` (max, mean, tokens)."""
    gaps = []
    for g in gens:
        [lp] = trainer.token_logprobs([g.prompt_ids], [g.completion_ids], adapter, temperature=temperature)
        gaps += (lp.float().cpu() - torch.tensor(g.logprobs)).abs().tolist()
    return {
        "max": max(gaps, default=0.0),
        "mean": statistics.fmean(gaps) if gaps else 0.0,
        "tokens": len(gaps),
    }


def embedded_check(model: str, device: str, dtype: str, prompts: list[list[int]], new_tokens: int) -> dict:
    t0 = time.perf_counter()
    engine = EmbeddedEngine(model, device=device, dtype=dtype, max_batch=len(prompts))
    loaded = time.perf_counter() - t0
    out = {"device": str(next(engine.model().parameters()).device), "dtype": str(next(engine.model().parameters()).dtype),
           "load_seconds": round(loaded, 2), **throughput(engine, prompts, None, new_tokens)}  # fmt: skip
    # the engine's own recorded log-probs against its scoring path (the same weights, batched vs one row)
    sampling = SamplingParams(temperature=0.7, max_new_tokens=new_tokens)
    gens = asyncio.run(generate_all(engine, prompts, None, sampling))
    out["self_logprob_gap"] = logprob_gap(engine, gens, None, 0.7)
    return out


def update_check(
    model: str, device: str, dtype: str, messages: int, tokens: int, rank: int, checkpointing: bool
) -> dict:
    """One optimiser step of the trainer's log-prob pass on `model` (training/policy.py AdapterPolicy, as
    an update runs it): `messages` messages of `tokens` random tokens (the first 32 the prompt, the rest the
    completion), log-probs with a gradient, backward, AdamW step of a fresh LoRA adapter of rank `rank`.
    `peak_gb`: torch.cuda.max_memory_allocated over the step (weights included; None on the CPU)."""
    import gc

    from teamtr.training.policy import AdapterPolicy
    from teamtr.training.rollouts import RoleMessages, pad

    gc.collect()  # the embedded check's engine, gone before this one loads
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
    engine = EmbeddedEngine(
        model, adapters={"solver": None}, device=device, dtype=dtype, lora=LoraSettings(r=rank)
    )
    params = engine.adapter_parameters("solver")
    optimizer = torch.optim.AdamW(list(params.values()), lr=1e-4)
    policy = AdapterPolicy(engine, "solver", "base", params, optimizer, gradient_checkpointing=checkpointing)
    config = engine.model().config
    vocab = config.vocab_size
    tokens = min(tokens, getattr(config, "max_position_embeddings", None) or tokens)  # the demo model: 512
    ids = torch.randint(0, vocab, (messages, tokens), generator=torch.Generator().manual_seed(0)).tolist()
    prompt = min(32, tokens // 2)
    completions = [s[prompt:] for s in ids]
    zeros, mask = pad([torch.zeros(len(c)) for c in completions])
    ones = torch.ones(messages)
    msgs = RoleMessages(
        [s[:prompt] for s in ids], completions, torch.arange(messages), ones, ones, mask, zeros
    )
    out: dict[str, Any] = {
        "messages": messages, "tokens": tokens, "completion_tokens": int(mask.sum()), "vocab": vocab,
        "lora_rank": rank, "gradient_checkpointing": checkpointing, "bf16_autocast": cuda and policy.bf16_autocast,
        "lora_params": sum(p.numel() for p in params.values()),
        "weights_gb": round(sum(p.numel() * p.element_size() for p in engine.model().parameters()) / 1e9, 3),
    }  # fmt: skip
    if cuda:
        torch.cuda.synchronize()
        out["allocated_before_gb"] = round(torch.cuda.memory_allocated() / 1e9, 3)
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    try:
        logp = policy.logp(msgs, grad=True)
        loss = -(logp * msgs.mask).sum() / msgs.mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if cuda:
            torch.cuda.synchronize()
        out["loss"] = float(loss)
        finite = bool(torch.isfinite(loss)) and all(bool(torch.isfinite(p).all()) for p in params.values())
        out["finite"] = finite
        del logp, loss
    except torch.OutOfMemoryError:  # where an update does not fit is a figure too (the peak it reached)
        out["out_of_memory"], out["finite"] = True, None
    out["seconds"] = round(time.perf_counter() - t0, 3)
    out["peak_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 3) if cuda else None
    out["peak_reserved_gb"] = round(torch.cuda.max_memory_reserved() / 1e9, 3) if cuda else None
    del engine, policy, optimizer, params
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return out


def vllm_check(
    model: str,
    device: str,
    dtype: str,
    prompts_text: list[str],
    new_tokens: int,
    swaps: int,
    work: Path,
    rank: int,
    url: str | None = None,
) -> tuple[dict, Any]:
    """Two role adapters served by vLLM (a server started here, or the one at `url`), their log-prob gap
    to the trainer's engine, `swaps` hot-swaps of one of them; returns the measurements and the server
    (for the stage; stopping an attached one leaves it running)."""
    from teamtr.engines.open import EngineSpec, vllm_server_config
    from teamtr.engines.vllm_engine import VLLMEngine
    from teamtr.engines.vllm_server import attach_vllm_server, launch
    from teamtr.training.vllm_rollouts import VLLMRollouts

    adapters = {
        name: random_lora(model, work / name, seed, rank)
        for seed, name in enumerate(["solver", "checker", "solver-next"], 1)
    }
    t0 = time.perf_counter()
    server = (
        attach_vllm_server(url)
        if url
        else launch(  # the settings every teamtr command launches vLLM with (engines/open.py)
            dataclasses.replace(
                vllm_server_config(
                    EngineSpec(bases={"base": str(model)}, kind="vllm", dtype=dtype, lora_rank=rank),
                    str(model),
                ),
                log_path=str(work / "vllm.log"),
            )
        )
    )
    out: dict[str, Any] = {
        "start_seconds": round(time.perf_counter() - t0, 1),
        "dtype": dtype,
        "url": server.url,
    }
    rollouts = VLLMRollouts(VLLMEngine({"base": server}))
    trainer = EmbeddedEngine(
        model, adapters={k: str(v) for k, v in adapters.items()}, device=device, dtype=dtype
    )
    tok = rollouts.tokenizer()
    prompts = [tok(p)["input_ids"] for p in prompts_text]
    temperature = 0.7
    sampling = SamplingParams(temperature=temperature, max_new_tokens=new_tokens)
    try:
        for version, role in enumerate(["solver", "checker"], 1):
            rollouts.push(role, adapters[role], version)
        out["throughput"] = throughput(rollouts, prompts, "solver", new_tokens)
        out["logprob_gap"] = {}
        for role in ("solver", "checker"):
            gens = asyncio.run(generate_all(rollouts, prompts, role, sampling))
            out["logprob_gap"][role] = logprob_gap(trainer, gens, role, temperature)
        # hot-swaps: the solver alternates between two weights, sampled right after each push
        failures, swap_seconds, current = 0, [], "solver"
        for i in range(swaps):
            new, old = ("solver-next", "solver") if current == "solver" else ("solver", "solver-next")
            try:
                swap_seconds.append(rollouts.push("solver", adapters[new], 10 + i))
                gens = asyncio.run(generate_all(rollouts, prompts[:4], "solver", sampling))
                to_new = logprob_gap(trainer, gens, new, temperature)["mean"]
                to_old = logprob_gap(trainer, gens, old, temperature)["mean"]
                failures += not to_new < to_old
                current = new
            except Exception as e:  # a failed push is what is counted here, not a crash of the check
                failures += 1
                out.setdefault("swap_errors", []).append(f"{type(e).__name__}: {e}"[:300])
        out["swaps"] = {"count": swaps, "failures": failures,
                        "seconds_max": round(max(swap_seconds, default=0.0), 3)}  # fmt: skip
    finally:
        rollouts.engine.close()
    return out, server


def stage_check(
    model: str, device: str, dtype: str, run_dir: Path, vllm_url: str | None, rank: int, episodes: int
) -> dict:
    """One TeamTR stage of the chain team (3 roles) on `model`, rollouts through vLLM when a URL is given."""
    from teamtr.graphs.run_layout import read_metrics
    from teamtr.training.config import TrainConfig
    from teamtr.training.trainer import Trainer

    rollout: dict[str, Any] = {
        "prompts_per_update": max(1, episodes // 4),
        "group_size": 4,
        "temperature": 1.0,
    }
    if vllm_url:
        rollout.update({"engine": "vllm", "vllm_url": vllm_url})
    cfg = TrainConfig.from_dict({
        "run_dir": str(run_dir), "stages": 1, "torch_threads": 1,
        "team": {"model": model, "lora_rank": rank, "device": device, "dtype": dtype},
        "rollout": rollout, "optim": {"lr": 3e-3, "epochs": 1, "minibatch_messages": 16},
        "eval": {"stage_episodes": episodes, "final_episodes": episodes},
    })  # fmt: skip
    t0 = time.perf_counter()
    summary = Trainer(cfg).train()
    updates = read_metrics(run_dir, kind="update")
    gaps = [u.get("logprob_gap_max") for u in updates if u.get("logprob_gap_max") is not None]
    return {
        "seconds": round(time.perf_counter() - t0, 1),
        "rollout_engine": "vllm" if vllm_url else "embedded",
        "updates": len(updates),
        "accepted": sum(bool(u["accepted"]) for u in updates),
        "rollout_tokens": summary.get("train_tokens"),
        "eval_before": (read_metrics(run_dir, kind="stage") or [{}])[0].get("eval_before"),
        "eval_after": (read_metrics(run_dir, kind="stage") or [{}])[0].get("eval_after"),
        "logprob_gap_max": summary.get("rollout_logprob_gap_max", max(gaps, default=None)),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda", help="cuda | cuda:K | cpu (the dry run)")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on a GPU, float32 on the CPU")
    parser.add_argument(
        "--model", default=None, help="a model reference (default: the demo's shipped warm model)"
    )
    parser.add_argument("--sequences", type=int, default=64, help="concurrent sequences for tokens/s")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--swaps", type=int, default=4)
    parser.add_argument(
        "--episodes", type=int, default=32, help="the stage's episodes per update and evaluation"
    )
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--vllm-url", default=None, help="attach to this vLLM server instead of starting one")
    parser.add_argument(
        "--no-vllm", action="store_true", help="skip the vLLM server (the stage rolls out embedded)"
    )
    parser.add_argument(
        "--update-messages", type=int, nargs="+", default=[4], help="messages of the log-prob update (each)"
    )
    parser.add_argument(
        "--shape", choices=sorted(SHAPES), default=None, help="a model of this architecture, random weights"
    )
    parser.add_argument(
        "--update-tokens",
        type=int,
        default=None,
        help="tokens per message (default: 1024 on a GPU, 64 on the CPU)",
    )
    parser.add_argument(
        "--update-only", action="store_true", help="only the log-prob update (no throughput, vLLM or stage)"
    )
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.shape and not args.update_only:
        parser.error("--shape measures the log-prob update only: add --update-only")
    dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    t0 = time.perf_counter()
    shape_dir = tempfile.TemporaryDirectory() if args.shape else None
    if shape_dir is not None:
        model = random_model(args.shape, Path(shape_dir.name), args.device, args.model or default_model())
    else:
        model = args.model or default_model()
    result: dict[str, Any] = {
        "device": args.device, "dtype": dtype, "model": model, "torch": torch.__version__,
        "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(), "python": platform.python_version(),
    }  # fmt: skip
    texts = (PROMPTS * (args.sequences // len(PROMPTS) + 1))[: args.sequences]
    if not args.update_only:
        engine_tok = EmbeddedEngine(model, device="cpu", dtype="float32").tokenizer()
        result["embedded"] = embedded_check(
            model, args.device, dtype, [engine_tok(t)["input_ids"] for t in texts], args.new_tokens
        )
    # one update of the log-prob pass, without and with body checkpointing, before vLLM takes GPU memory
    update_tokens = args.update_tokens or (64 if args.device == "cpu" else 1024)
    result["update"] = []
    for messages in args.update_messages:
        for ckpt in (False, True):
            done = update_check(model, args.device, dtype, messages, update_tokens, args.lora_rank, ckpt)
            result["update"].append(done)
            print(json.dumps({"update": done}), file=sys.stderr, flush=True)  # kept if a timeout comes
    if shape_dir is not None:
        result["shape"] = args.shape
        shape_dir.cleanup()
    if args.update_only:
        result["ok"] = all(u["finite"] for u in result["update"] if not u.get("out_of_memory"))
        return _finish(result, t0, args.out)
    server = None
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.no_vllm:
            result["vllm"] = {"skipped": "--no-vllm"}
        else:
            from teamtr.engines.vllm_server import vllm_available

            ok, why = vllm_available()
            if not ok:
                result["vllm"] = {"skipped": why}
            else:
                result["vllm"], server = vllm_check(
                    model,
                    args.device,
                    dtype,
                    texts,
                    args.new_tokens,
                    args.swaps,
                    work,
                    args.lora_rank,
                    args.vllm_url,
                )
        try:
            result["stage"] = stage_check(model, args.device, dtype, work / "run", server.url if server else None,
                                          args.lora_rank, args.episodes)  # fmt: skip
        finally:
            if server is not None:
                server.stop()
    swaps = result["vllm"].get("swaps", {})
    result["ok"] = (
        swaps.get("failures", 0) == 0
        and result["stage"]["updates"] > 0
        and all(u["finite"] for u in result["update"])
    )
    return _finish(result, t0, args.out)


def _finish(result: dict, t0: float, out: Path | None) -> dict:
    result["seconds"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(result, indent=1)
    if out:
        out.write_text(text)
    print(text)
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["ok"] else 1)
