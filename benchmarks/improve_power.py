"""The power of `teamtr improve`'s gate and canary (docs/improve.md), by simulation of the functions that
decide (improve/stats.py `gate_test`, `canary_crossings`), printed beside the old decisions'
(the empirical-Bernstein confidence sequence on the gate's prompts and on the canary's k-th/k-th pairs).

Rewards are Bernoulli (a verifier or thumbs-up feedback), the incumbent's right with probability 0.5, the
candidate's 0.5 + delta, the two arms independent (the worst case for pairing). A second canary table
has prompts of their own difficulty (half at 0.2, half at 0.8, the candidate + delta on each), where
pairing by prompt removes the prompt-to-prompt variance that k-th/k-th pairs keep.

    gate    one look at n held-out prompts, one greedy answer each, one-sided 95%
    canary  looked at after every pair, 2.5% per side; promote / roll back at the first crossing, roll
            back at the cap

    .venv/bin/python benchmarks/improve_power.py [--runs 2000] [--out benchmarks/results/improve_power]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from teamtr.improve.stats import canary_crossings, confidence_path, gate_power, gate_test

P, CONFIDENCE = 0.5, 0.95
GATE_N, GATE_DELTAS = (12, 32, 64, 128, 256, 512), (0.0, 0.1, 0.2, 0.3, 0.5)
CANARY_DELTAS = (-0.1, 0.0, 0.1, 0.2, 0.3, 0.5)
WITHIN = (200, 400, 1000)


def binary(rng: np.random.Generator, runs: int, n: int, p: float | np.ndarray) -> np.ndarray:
    return (rng.random((runs, n)) < p).astype(np.float64)


def gate_rows(runs: int, rng: np.random.Generator) -> list[dict]:
    rows = []
    for n in GATE_N:
        for delta in GATE_DELTAS:
            c, i = binary(rng, runs, n, P + delta), binary(rng, runs, n, P)
            new = np.mean([gate_test(c[r], i[r], 0, 1, CONFIDENCE).passed for r in range(runs)])
            old = np.mean(
                [
                    confidence_path(c[r] - i[r], -1, 1, 1 - CONFIDENCE, sides=1, horizon=n)[0][-1] > 0
                    for r in range(runs)
                ]
            )
            exact = gate_power(delta, n, CONFIDENCE)
            rows.append({"n": n, "delta": delta, "new": float(new), "exact": exact, "old": float(old)})
    return rows


def stops(d: np.ndarray, cap: int) -> dict:
    up, down = canary_crossings(d[:, :cap], 0, 1, CONFIDENCE)
    promoted = (up < down) & (up < cap)
    out = {f"promoted_within_{w}": float(np.mean(promoted & (up < w))) for w in WITHIN if w <= cap}
    out["rolled_back_early"] = float(np.mean((down < up) & (down < cap)))
    out["median_pairs"] = float(np.median(np.minimum(np.minimum(up, down), cap - 1) + 1))
    return out


def old_canary(d: np.ndarray, cap: int = 400) -> dict:
    promoted = early = 0
    for row in d[:, :cap]:
        lower, upper = confidence_path(row, -1, 1, 1 - CONFIDENCE)
        up = int(np.argmax(lower > 0)) if (lower > 0).any() else cap
        down = int(np.argmax(upper < 0)) if (upper < 0).any() else cap
        promoted += up < down
        early += down < up
    return {"promoted_within_400": promoted / len(d), "rolled_back_early": early / len(d)}


def canary_rows(runs: int, rng: np.random.Generator) -> list[dict]:
    rows = []
    for delta in CANARY_DELTAS:
        d = binary(rng, runs, 1000, P + delta) - binary(rng, runs, 1000, P)
        rows.append({"delta": delta, "new_cap_1000": stops(d, 1000), "old_cap_400": old_canary(d)})
    return rows


def prompt_rows(runs: int, rng: np.random.Generator) -> list[dict]:
    """Prompts of their own difficulty: paired by prompt vs the k-th canary against the k-th incumbent."""
    rows = []
    for delta in (0.0, 0.1, 0.2):
        ease = np.where(rng.random((runs, 1000)) < 0.5, 0.2, 0.8)  # the canary episode's prompt
        other = np.where(rng.random((runs, 1000)) < 0.5, 0.2, 0.8)  # an unpaired incumbent's prompt
        cand = binary(rng, runs, 1000, ease + delta)
        paired = cand - binary(rng, runs, 1000, ease)
        unpaired = cand - binary(rng, runs, 1000, other)
        rows.append({"delta": delta, "paired": stops(paired, 1000), "unpaired": stops(unpaired, 1000)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/improve_power")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    started = time.time()
    gate, canary, prompts = (
        gate_rows(args.runs, rng),
        canary_rows(args.runs, rng),
        prompt_rows(args.runs, rng),
    )
    print(f"gate ({args.runs} runs): P(pass) at delta " + " / ".join(f"{d:+.1f}" for d in GATE_DELTAS))
    for key, what in (
        ("new", "new: exact sign test, simulated"),
        ("exact", "new: exact"),
        ("old", "old: EB"),
    ):
        print(f"  {what}")
        for n in GATE_N:
            print(f"    {n:4d}  " + "  ".join(f"{r[key]:.3f}" for r in gate if r["n"] == n))
    print(
        f"canary ({args.runs} runs, arms independent): new (betting test, cap 1000 pairs) | old (EB, cap 400)"
    )
    print(
        "  delta  P(promoted within 200 / 400 / 1000)  rolled back early  median pairs | old: promoted, early"
    )
    for r in canary:
        n, o = r["new_cap_1000"], r["old_cap_400"]
        print(
            f"  {r['delta']:+.1f}   {n['promoted_within_200']:.3f} / {n['promoted_within_400']:.3f} / "
            f"{n['promoted_within_1000']:.3f}        {n['rolled_back_early']:.3f}           "
            f"{n['median_pairs']:6.1f} | {o['promoted_within_400']:.3f}, {o['rolled_back_early']:.3f}"
        )
    print("canary, prompts at 0.2 or 0.8 (the candidate + delta): paired by prompt vs unpaired, cap 1000")
    for r in prompts:
        p, u = r["paired"], r["unpaired"]
        print(
            f"  {r['delta']:+.1f}   paired {p['promoted_within_200']:.3f} / {p['promoted_within_1000']:.3f} "
            f"(median {p['median_pairs']:.0f})   unpaired {u['promoted_within_200']:.3f} / "
            f"{u['promoted_within_1000']:.3f} (median {u['median_pairs']:.0f})"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "runs": args.runs,
        "seed": args.seed,
        "confidence": CONFIDENCE,
        "seconds": round(time.time() - started, 1),
        "gate": gate,
        "canary": canary,
        "canary_prompt_difficulty": prompts,
    }
    (out / "power.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out / 'power.json'} ({result['seconds']} s)")


if __name__ == "__main__":
    main()
