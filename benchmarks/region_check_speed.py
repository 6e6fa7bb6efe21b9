"""Time of one trust-region check (training/trust_region.py `ExactRegion.check`), pi_cur's states kept beside
recomputed, in one run.

    python benchmarks/region_check_speed.py                  # SmolLM2-135M-Instruct, 64 messages
    python benchmarks/region_check_speed.py --messages 16    # a quick look

The probe check measures the exact KL between pi_cur and the adapter as it is now after every optimiser
step, on the batch's and the probe's messages. pi_cur never moves within an update, so its body pass can
run once (`before_states` of training/vocab_kl.py `message_divergences`); `recomputed` is the pass as it
was before, both passes every check. Messages: `--prompt` tokens of context and `--completion` tokens
written, drawn from the tokenizer's vocabulary; a LoRA adapter on q/k/v/o with its B drawn at random so
the two weight sets differ. Prints the median of `--repeats` checks each and their ratio.
Results: benchmarks/results/region_check_speed/result.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--messages", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=120)
    ap.add_argument("--completion", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "region_check_speed")
    args = ap.parse_args()

    import torch

    from teamtr.engines.embedded import EmbeddedEngine, LoraSettings
    from teamtr.engines.models import resolve_model
    from teamtr.training.vocab_kl import Side, message_divergences

    torch.set_num_threads(args.threads)
    path = resolve_model(args.model).path
    engine = EmbeddedEngine(
        path, adapters={"r": None}, lora=LoraSettings(target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    )
    gen = torch.Generator().manual_seed(0)
    vocab = engine.tokenizer("base").vocab_size
    prompts = [torch.randint(10, vocab, (args.prompt,), generator=gen).tolist() for _ in range(args.messages)]
    completions = [
        torch.randint(10, vocab, (args.completion,), generator=gen).tolist() for _ in range(args.messages)
    ]
    cur = engine.snapshot_adapter("r")
    with torch.no_grad():
        for name, p in engine.adapter_parameters("r").items():
            if "lora_B" in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.01)
    side = Side(engine, "base", "r")

    def timed(kept: list | None) -> tuple[float, torch.Tensor]:
        t0 = time.perf_counter()
        kl, _ = message_divergences(side, prompts, completions, cur, before_states=kept)
        return time.perf_counter() - t0, kl.forward

    recomputed = [timed(None) for _ in range(args.repeats)]
    kept: list = []
    timed(kept)  # the update's first check: pi_cur's states computed and kept
    cached = [timed(kept) for _ in range(args.repeats)]
    assert all(torch.equal(k, recomputed[0][1]) for _, k in cached), "kept states changed the KL"
    result = {
        "model": args.model,
        "messages": args.messages,
        "prompt_tokens": args.prompt,
        "completion_tokens": args.completion,
        "threads": args.threads,
        "recomputed_seconds": statistics.median(t for t, _ in recomputed),
        "kept_seconds": statistics.median(t for t, _ in cached),
    }
    result["ratio_kept_over_recomputed"] = result["kept_seconds"] / result["recomputed_seconds"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"one check, {args.messages} messages of {args.prompt}+{args.completion} tokens on {args.model}: "
        f"pi_cur recomputed {result['recomputed_seconds']:.2f} s, kept {result['kept_seconds']:.2f} s "
        f"(x{result['ratio_kept_over_recomputed']:.2f}); KLs bit-identical"
    )


if __name__ == "__main__":
    main()
