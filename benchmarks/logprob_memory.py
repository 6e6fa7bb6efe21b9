"""Peak CPU memory of one forward + backward of the trainer's log-prob pass, old pattern beside new.

    python benchmarks/logprob_memory.py                       # 4 messages x 1,024 tokens, V = 32,000 and 151,936
    python benchmarks/logprob_memory.py --vocabs 32000 --tokens 128 --out /tmp/lpm   # a quick look

A small Llama (2 layers, hidden 256, fp32 on the CPU) with a LoRA adapter on every linear layer of the body
(B drawn at random so gradients flow), as the trainer has it; loss = a weighted sum of the completion
tokens' log-probs, then backward. Each message is `--tokens` long, its last `--tokens - --prompt` tokens
the completion (nearly every position needs a log-prob: the new pass's worst case).

- old: the pattern engines/embedded_scoring.py had until issue 33: float32 logits at every position
  of the padded batch, log_softmax over the vocabulary (a second copy), gather the sampled tokens.
- new: embedded_scoring.completion_states + selective_logprobs: hidden states at completion positions
  only, the LM head a chunk of positions at a time (about LOGIT_CHUNK_BYTES of float32 logits), log p =
  logit[token] - logsumexp, each chunk under activation checkpointing.

Memory: each case runs in a fresh process (so no case inherits another's allocator state); the process's
peak resident set (Linux VmHWM) is reset just before the pass (`echo 5 > /proc/self/clear_refs`) and read
after the backward: `peak_gb` is the whole process at its peak during the pass (weights, the Python and
torch runtime included), `pass_gb` that peak minus the resident set just before the pass (what the pass
added). RSS, not tracemalloc (which does not see torch's allocations) and not torch's profiler.

Second part (for the Qwen3-8B projection in docs/models.md, "One update of Qwen3-8B"): the bytes autograd
keeps for the backward pass per token, counted with saved-tensor hooks (distinct storages, weights left
out), on a Qwen3-8B-shaped body (hidden 4,096, MLP 12,288, 32 heads, 8 KV heads of 128, bfloat16 weights,
LoRA r 8 on q/k/v/o/gate/up/down in float32, as peft makes it) with 1 and 3 layers: the difference is the
cost of one layer, the rest the per-pass constant. Without checkpointing (with and without bfloat16 autocast)
and with body checkpointing (`--no-activations` skips it).
Results: benchmarks/results/logprob_memory/result.json (and README.md there).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "logprob_memory"
GB = 1e9


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def run_case(pattern: str, vocab: int, args: argparse.Namespace) -> dict:
    """One forward + backward in this process; returns its memory and time."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from teamtr.engines.embedded_scoring import completion_states, selective_logprobs

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 4,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=args.hidden // 64,
        max_position_embeddings=max(2048, args.tokens),
        tie_word_embeddings=False,
        pad_token_id=0,
    )
    lora = LoraConfig(
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    model = get_peft_model(LlamaForCausalLM(config), lora)
    model.eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)
    gen = torch.Generator().manual_seed(1)
    seqs = torch.randint(3, vocab, (args.messages, args.tokens), generator=gen).tolist()
    prompts = [s[: args.prompt] for s in seqs]
    completions = [s[args.prompt :] for s in seqs]
    weights = torch.linspace(0.5, 1.5, args.messages * len(completions[0]))

    rss_before = _status_kb("VmRSS") * 1024
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM: the peak from here on
    start = time.perf_counter()
    if pattern == "old":
        ids = torch.tensor(seqs)
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float()
        logp = torch.log_softmax(logits[:, :-1], dim=-1)
        pos = torch.arange(args.prompt - 1, args.tokens - 1)
        picked = torch.stack([logp[i, pos, torch.tensor(c)] for i, c in enumerate(completions)])
        values = picked.reshape(-1)
    else:
        states = completion_states(model, 0, prompts, completions)
        values = selective_logprobs(states)
    (values * weights).sum().backward()
    seconds = time.perf_counter() - start
    peak = _status_kb("VmHWM") * 1024
    grad_norm = float(
        torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None))
    )
    return {
        "pattern": pattern,
        "vocab": vocab,
        "peak_gb": round(peak / GB, 3),
        "pass_gb": round((peak - rss_before) / GB, 3),
        "rss_before_gb": round(rss_before / GB, 3),
        "seconds": round(seconds, 1),
        "logprob_sum": float(values.detach().double().sum()),
        "lora_grad_norm": grad_norm,
    }


QWEN3_8B = {"hidden_size": 4096, "intermediate_size": 12288, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "num_hidden_layers": 36}  # fmt: skip


def saved_bytes_per_token(layers: int, tokens: int) -> dict:
    """Bytes autograd keeps for backward per token of one log-prob pass on a Qwen3-8B-shaped body of
    `layers` layers: without checkpointing (float32 / bfloat16 autocast), and with body checkpointing."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from teamtr.engines.embedded_scoring import (
        completion_states,
        enable_body_checkpointing,
        selective_logprobs,
    )

    torch.manual_seed(0)
    shape = {**QWEN3_8B, "num_hidden_layers": layers}
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=1000, tie_word_embeddings=False, **shape)).to(
        torch.bfloat16
    )
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=targets))
    model.eval()
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    ids = torch.randint(3, 1000, (tokens,), generator=torch.Generator().manual_seed(1)).tolist()

    def measure(checkpoint: bool, autocast: bool) -> float:
        kept: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            if storage.data_ptr() not in weights:
                kept[storage.data_ptr()] = storage.nbytes()
            return t

        with (
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast),
        ):
            states = completion_states(model, 0, [ids[:1]], [ids[1:]], checkpoint_body=checkpoint)
            selective_logprobs(states)
        return sum(kept.values()) / tokens

    out = {"plain": measure(False, False), "autocast": measure(False, True)}
    enable_body_checkpointing(model)
    out["checkpointed"] = measure(True, True)
    return out


def activations(tokens: int) -> dict:
    """Per-layer and per-pass saved bytes per token (1- and 3-layer bodies), projected to Qwen3-8B's 36."""
    runs = {}
    for layers in (1, 3):
        out = subprocess.run(
            [sys.executable, __file__, "--activations-case", str(layers), "--tokens", str(tokens)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if out.returncode != 0:
            raise SystemExit(f"activations, {layers} layers, failed:\n{out.stderr[-3000:]}")
        runs[layers] = json.loads(out.stdout.strip().splitlines()[-1])
    result: dict[str, Any] = {"tokens": tokens, "unit": "KiB per token"}
    for mode in ("plain", "autocast", "checkpointed"):
        per_layer = (runs[3][mode] - runs[1][mode]) / 2
        constant = runs[1][mode] - per_layer
        result[mode] = {
            "per_layer": round(per_layer / 1024, 1),
            "per_pass": round(constant / 1024, 1),
            "qwen3_8b_36_layers_mib": round((36 * per_layer + constant) / 2**20, 3),
        }
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocabs", type=int, nargs="+", default=[32_000, 151_936])
    ap.add_argument("--patterns", nargs="+", default=["old", "new"], choices=["old", "new"])
    ap.add_argument("--messages", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=1024, help="prompt + completion tokens per message")
    ap.add_argument("--prompt", type=int, default=24, help="prompt tokens per message")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--no-activations", action="store_true", help="skip the Qwen3-8B-shaped activation count")
    ap.add_argument("--activations-tokens", type=int, default=256)
    ap.add_argument("--activations-case", type=int, help=argparse.SUPPRESS)  # one body, JSON out
    ap.add_argument(
        "--case", nargs=2, metavar=("PATTERN", "VOCAB"), help=argparse.SUPPRESS
    )  # one case, JSON out
    args = ap.parse_args()
    if args.activations_case:
        print(json.dumps(saved_bytes_per_token(args.activations_case, args.tokens)))
        return
    if args.case:
        print(json.dumps(run_case(args.case[0], int(args.case[1]), args)))
        return
    shared = ["--messages", str(args.messages), "--tokens", str(args.tokens), "--prompt", str(args.prompt),
              "--hidden", str(args.hidden), "--layers", str(args.layers), "--threads", str(args.threads)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    cases: list[dict] = []
    for vocab in args.vocabs:
        for pattern in args.patterns:
            out = subprocess.run(
                [sys.executable, __file__, "--case", pattern, str(vocab), *shared],
                capture_output=True, text=True, env=env, check=False,
            )  # fmt: skip
            if out.returncode != 0:
                raise SystemExit(f"case {pattern} V={vocab} failed:\n{out.stderr[-3000:]}")
            case = json.loads(out.stdout.strip().splitlines()[-1])
            cases.append(case)
            print(f"{pattern:>3}  V={vocab:>7,}  peak {case['peak_gb']:6.2f} GB  pass {case['pass_gb']:6.2f} GB"
                  f"  {case['seconds']:6.1f} s", flush=True)  # fmt: skip
    by = {(c["pattern"], c["vocab"]): c for c in cases}
    ratios: dict[str, float] = {}
    for vocab in args.vocabs:
        if ("old", vocab) in by and ("new", vocab) in by:
            ratios[f"new_over_old_V{vocab}"] = round(
                by["new", vocab]["peak_gb"] / by["old", vocab]["peak_gb"], 3
            )
    if len(args.vocabs) == 2:
        small, large = sorted(args.vocabs)
        for pattern in args.patterns:
            ratios[f"{pattern}_V{large}_over_V{small}"] = round(
                by[pattern, large]["peak_gb"] / by[pattern, small]["peak_gb"], 3
            )
    print("\npeak    " + "".join(f"  V={v:>9,}" for v in args.vocabs))
    for pattern in args.patterns:
        print(f"{pattern:>8}" + "".join(f"  {by[pattern, v]['peak_gb']:8.2f} GB" for v in args.vocabs))
    for name, value in ratios.items():
        print(f"{name}: {value}")
    # agreement of the two patterns on the same model and tokens (same seed): values and gradients
    for vocab in args.vocabs:
        if ("old", vocab) in by and ("new", vocab) in by:
            o, n = by["old", vocab], by["new", vocab]
            print(f"V={vocab}: sum of log-probs old {o['logprob_sum']:.4f} new {n['logprob_sum']:.4f}; "
                  f"LoRA grad norm old {o['lora_grad_norm']:.6g} new {n['lora_grad_norm']:.6g}")  # fmt: skip
    result = {
        "command": " ".join(["python benchmarks/logprob_memory.py", *sys.argv[1:]]),
        "settings": {
            "messages": args.messages,
            "tokens": args.tokens,
            "prompt": args.prompt,
            "hidden": args.hidden,
            "layers": args.layers,
            "threads": args.threads,
            "dtype": "float32",
            "device": "cpu",
            "lora": "r 8 on q/k/v/o/gate/up/down, base frozen",
            "memory": "VmHWM (peak RSS) of a fresh process "
            "per case, reset just before the pass; pass_gb = peak - RSS before the pass",
        },  # fmt: skip
        "cases": cases,
        "ratios": ratios,
    }
    if not args.no_activations:
        result["activations"] = activations(args.activations_tokens)
        for mode in ("plain", "autocast", "checkpointed"):
            a = result["activations"][mode]
            print(f"Qwen3-8B-shaped body, {mode}: {a['per_layer']} KiB / token / layer + {a['per_pass']} KiB / "
                  f"token / pass = {a['qwen3_8b_36_layers_mib']} MiB / token at 36 layers")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out / 'result.json'}")


if __name__ == "__main__":
    main()
