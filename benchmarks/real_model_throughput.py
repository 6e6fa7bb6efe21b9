"""SmolLM2-135M-Instruct on this machine: generation, team rollouts and one TeamTR stage, in one run.

    nice -n 5 .venv/bin/python benchmarks/real_model_throughput.py [--new-tokens 64] [--batches 1 16 32]
        [--episodes 32] [--stage-prompts 4 --stage-group 4] [--out benchmarks/results/real_model.json]

One vLLM server (vLLM CPU, float32, 1 GiB of KV cache, --max-model-len 2048) and one embedded engine on
the prepared SmolLM2 folder (`teamtr models prepare smollm2`), both with the same three random rank-8
role LoRAs (q/k/v/o/gate/up/down). Three measurements:

1. generation: B concurrent `generate` calls (B different prompts, `--new-tokens` each, T = 1, seeded) to
   each engine, the engines alternating; tokens/s of each and vLLM / embedded, without adapters and with
   the role LoRAs (request k on role k mod 3). A request may end early at EOS: rates count the tokens
   actually generated.
2. team rollouts through vLLM: `--episodes` episodes of the 3-role chain team (graphs/chain_team.py roles,
   `--team-tokens` per message, no stop) through `VLLMEngine`, then the same requests (each captured
   turn's prompt ids, adapter and seed, turn after turn per episode, all episodes at once) sent straight
   to the same engine; tokens/s of each and their ratio (the cost of LangGraph, LangChain and capture
   when vLLM decodes; goal >= 0.9), after a warm-up of both at full size. Per phase also this process's
   CPU per turn, the spread of each turn wave's sends (a late request joins vLLM's batch steps later)
   and vLLM's prefix-cache hits (from /metrics).
3. one TeamTR stage with `rollout.engine: vllm` attached to the server: examples/smollm2_team.yaml's
   team and task and update settings (2 roles, 2 updates; `--stage-lr`, default the example's 2.5e-4;
   docs/models.md has the measurements), `--stage-prompts` x `--stage-group` episodes
   per rollout, held-out evaluation off (run from the repository root, where `examples.smollm2_team`
   imports): wall time split
   into rollout (vLLM sampling), scoring (the trainer's no-grad log-probs: pi_cur of the batch, the
   trust-region monitor, vLLM-vs-trainer gaps), update (the optimiser's epochs and the rest of the
   update), adapter push (save is in update; the push is the /v1/load_lora_adapter call) and evaluation
   (0 with the evaluation off; the trainer's `held_out_return`).
   The split is measured by timing wrappers around the trainer's own methods (the code that runs is the
   trainer's).

`--profile-team` measures instead, without a server, the team's own CPU per turn and its cProfile (the
chain team over an engine that answers at once).

Prints the machine's load average before and after (other processes share the CPUs here).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from teamtr.engines.embedded import EmbeddedEngine, LoraSettings
from teamtr.engines.models import resolve_model
from teamtr.engines.open import EngineSpec, open_engine
from teamtr.engines.random_adapters import randomise_lora_b
from teamtr.engines.vllm_engine import VLLMEngine
from teamtr.engines.vllm_server import VLLMServer, start_vllm_server
from teamtr.graphs.chain_team import chain_roles
from teamtr.graphs.engine import Engine, SamplingParams
from teamtr.graphs.team import Team, derive_seed
from teamtr.graphs.trajectory import Trajectory
from teamtr.tasks import get_task

ROLES = ("adder1", "adder2", "adder3")
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def write_role_adapters(engine: EmbeddedEngine, root: Path) -> dict[str, Path]:
    """Three random rank-8 LoRAs (B ~ N(0, 0.02): they change the outputs), saved by peft."""
    out = {}
    for k, role in enumerate(ROLES):
        torch.manual_seed(k)
        engine.add_adapter(role, config=LoraSettings(r=8, alpha=16, target_modules=TARGETS).peft_config())
        randomise_lora_b(engine.adapter_parameters(role), 0.02)
        out[role] = engine.save_adapter(role, root / role)
    return out


# ---- 1. generation -------------------------------------------------------------------------------------
async def tokens_per_second(engine: Engine, prompts: list[list[int]], lora: bool, new_tokens: int) -> float:
    t0 = time.perf_counter()
    gens = await asyncio.gather(
        *(
            engine.generate(
                p,
                adapter=ROLES[i % len(ROLES)] if lora else None,
                sampling=SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=i),
            )
            for i, p in enumerate(prompts)
        )
    )
    return sum(len(g.completion_ids) for g in gens) / (time.perf_counter() - t0)


def generation(engines: dict[str, Engine], args: argparse.Namespace) -> list[dict]:
    tok = engines["embedded"].tokenizer()
    rows = []

    async def run() -> None:
        await tokens_per_second(engines["vllm"], [tok("Hi")["input_ids"]], True, 4)  # warm-up both
        await tokens_per_second(engines["embedded"], [tok("Hi")["input_ids"]], True, 4)
        for lora in (False, True):
            for batch in args.batches:
                prompts = [
                    tok.apply_chat_template(
                        [{"role": "user", "content": f"What is {i} + {3 * i + 7}? Explain."}],
                        add_generation_prompt=True,
                        tokenize=True,
                        return_dict=False,
                    )
                    for i in range(batch)
                ]
                rates: dict[str, list[float]] = defaultdict(list)
                for _ in range(args.repeats):  # alternate, so other processes' load hits both alike
                    for name, engine in engines.items():
                        rates[name].append(await tokens_per_second(engine, prompts, lora, args.new_tokens))
                e, v = statistics.median(rates["embedded"]), statistics.median(rates["vllm"])
                rows.append(
                    {
                        "batch": batch,
                        "adapters": "role LoRAs" if lora else "none",
                        "embedded_tok_s": round(e, 1),
                        "vllm_tok_s": round(v, 1),
                        "vllm_over_embedded": round(v / e, 2),
                        "load": load(),
                    }
                )
                print(rows[-1], flush=True)
        await engines["vllm"].aclose()

    asyncio.run(run())
    return rows


# ---- 2. team rollouts through vLLM vs the same requests straight to vLLM --------------------------------
async def direct_calls(engine: VLLMEngine, trajs: list[Trajectory], sampling: SamplingParams) -> int:
    """The captured turns' requests, turn after turn within an episode, all episodes at once."""

    async def episode(traj: Trajectory) -> int:
        n = 0
        for k, turn in enumerate(traj.turns):
            gen = await engine.generate(
                turn.prompt_ids,
                adapter=turn.adapter,
                sampling=SamplingParams(
                    temperature=sampling.temperature,
                    max_new_tokens=sampling.max_new_tokens,
                    seed=derive_seed(traj.metadata["seed"], k),
                ),
            )
            n += len(gen.completion_ids)
        return n

    try:
        return sum(await asyncio.gather(*(episode(t) for t in trajs)))
    finally:
        await engine.aclose()  # its HTTP client belongs to this event loop


class ArrivalLog:
    """Wraps an engine's `generate` to note when each request is sent (the turn's prompt ready)."""

    def __init__(self, engine: VLLMEngine) -> None:
        self.engine, self.times = engine, []
        self._generate = engine.generate

        async def generate(*a: Any, **kw: Any) -> Any:
            self.times.append(time.perf_counter())
            return await self._generate(*a, **kw)

        engine.generate = generate  # type: ignore[method-assign]

    def waves(self) -> list[list[float]]:
        """The sends grouped into turn waves: a wave's requests go out together, the next only after
        their answers (seconds later here), so a gap over 1 s starts a new wave."""
        waves: list[list[float]] = []
        for t in sorted(self.times):
            if waves and t - waves[-1][-1] < 1.0:
                waves[-1].append(t)
            else:
                waves.append([t])
        self.times = []
        return waves

    def close(self) -> None:
        del self.engine.generate  # back to the class's method


def prefix_cache_tokens(server_url: str) -> tuple[float, float]:
    """vLLM's prefix-cache counters (hit tokens, queried tokens) from /metrics."""
    import httpx

    hits = queries = 0.0
    for line in httpx.get(f"{server_url}/metrics", timeout=30).text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("vllm:prefix_cache_hits_total"):
            hits += float(value)
        elif name.startswith("vllm:prefix_cache_queries_total"):
            queries += float(value)
    return hits, queries


def team_rollouts(vllm: VLLMEngine, server_url: str, args: argparse.Namespace) -> list[dict]:
    """Per phase also: this process's CPU seconds (the client side: LangGraph, LangChain, capture, chat
    template and HTTP for the team; HTTP alone for the direct requests), how far apart the requests of
    one turn wave reach vLLM (a late request joins the decode batch steps later), and vLLM's prefix-cache
    hits (the direct requests repeat the team's prompts)."""
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.team_tokens)
    team = Team.from_engine(chain_roles(sampling=sampling), vllm, name="chain")
    task = get_task("chain")
    rows = []
    warm = team.run(task.generate(args.episodes, seed=99), seed=99)  # warm-up at full size, both paths
    asyncio.run(direct_calls(vllm, warm, sampling))
    arrivals = ArrivalLog(vllm)
    try:
        for k in range(args.repeats):
            tasks = task.generate(args.episodes, seed=k)
            hits0, queries0 = prefix_cache_tokens(server_url)
            t0, c0 = time.perf_counter(), time.process_time()
            trajs = team.run(tasks, seed=k)
            team_s, team_cpu = time.perf_counter() - t0, time.process_time() - c0
            team_waves = arrivals.waves()
            hits1, queries1 = prefix_cache_tokens(server_url)
            team_tokens = sum(len(t.completion_ids) for traj in trajs for t in traj.turns)
            t0, c0 = time.perf_counter(), time.process_time()
            direct_tokens = asyncio.run(direct_calls(vllm, trajs, sampling))
            direct_s, direct_cpu = time.perf_counter() - t0, time.process_time() - c0
            direct_waves = arrivals.waves()
            hits2, queries2 = prefix_cache_tokens(server_url)
            turns = sum(len(traj.turns) for traj in trajs)
            spread = lambda waves: [round(1000 * (w[-1] - w[0]), 1) for w in waves]  # noqa: E731
            rows.append(
                {
                    "episodes": args.episodes,
                    "team_tok_s": round(team_tokens / team_s, 1),
                    "direct_tok_s": round(direct_tokens / direct_s, 1),
                    "team_over_direct": round((team_tokens / team_s) / (direct_tokens / direct_s), 3),
                    "team_tokens": team_tokens,
                    "direct_tokens": direct_tokens,
                    "team_s": round(team_s, 1),
                    "direct_s": round(direct_s, 1),
                    "client_cpu_ms_per_turn": {
                        "team": round(1000 * team_cpu / turns, 2),
                        "direct": round(1000 * direct_cpu / turns, 2),
                    },
                    "wave_sizes": {
                        "team": [len(w) for w in team_waves],
                        "direct": [len(w) for w in direct_waves],
                    },
                    "wave_spread_ms": {"team": spread(team_waves), "direct": spread(direct_waves)},
                    "prefix_cache_hit_tokens": {"team": hits1 - hits0, "direct": hits2 - hits1},
                    "prefix_cache_query_tokens": {"team": queries1 - queries0, "direct": queries2 - queries1},
                    "load": load(),
                }
            )
            print(rows[-1], flush=True)
    finally:
        arrivals.close()
    return rows


# ---- 3. one TeamTR stage through vLLM rollouts ----------------------------------------------------------
def timed(owner: Any, name: str, bucket: dict[str, float], key: Callable[..., str | None]) -> None:
    """Wrap owner.name so its wall time adds to bucket[key(*args)] (None: not counted)."""
    original = getattr(owner, name)

    def wrapper(*a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(*a, **kw)
        finally:
            label = key(*a, **kw)
            if label is not None:
                bucket[label] += time.perf_counter() - t0

    setattr(owner, name, wrapper)


def teamtr_stage(model_dir: Path, server: VLLMServer, work: Path, args: argparse.Namespace) -> dict:
    from teamtr.graphs.run_layout import read_metrics
    from teamtr.training import llm_team, trainer
    from teamtr.training.config import TrainConfig
    from teamtr.training.policy import AdapterPolicy

    bucket: dict[str, float] = defaultdict(float)
    timed(llm_team.LLMStageTeam, "rollout", bucket, lambda *a, **kw: "rollout")
    timed(AdapterPolicy, "logp", bucket, lambda self, msgs, grad: None if grad else "scoring")
    timed(AdapterPolicy, "score", bucket, lambda *a, **kw: "scoring")  # vLLM-vs-trainer gaps
    timed(llm_team.LLMStageTeam, "update", bucket, lambda *a, **kw: "update_total")
    timed(trainer, "held_out_return", bucket, lambda *a, **kw: "evaluation")
    cfg = TrainConfig.from_dict(
        {
            "run_dir": str(work / "stage-run"),
            "stages": 1,
            # the example's team and task (examples/smollm2_team.py): a stage with rewards that vary
            "task": {"name": "sum_of_two", "data": "examples.smollm2_team:task_family"},
            "team": {
                "model": str(model_dir),
                "roles": "examples.smollm2_team:roles",
                "device": "cpu",
                "lora_rank": 8,
                "lora_targets": ["q_proj", "k_proj", "v_proj", "o_proj"],
            },
            "schedule": {"kind": "teamtr"},
            "rollout": {
                "engine": "vllm",
                "vllm_url": server.url,
                "prompts_per_update": args.stage_prompts,
                "group_size": args.stage_group,
            },
            "optim": {"lr": args.stage_lr, "epochs": 2, "minibatch_messages": 16},
            "trust_region": {"delta": 0.1, "heldout_episodes": 0},
            "eval": {"stage_episodes": 0},
        }
    )
    t0 = time.perf_counter()
    trainer.Trainer(cfg).train()
    total = time.perf_counter() - t0
    updates = read_metrics(cfg.run_dir, kind="update")
    push = sum(u["adapter_push_seconds"] or 0.0 for u in updates)
    update = bucket["update_total"] - bucket["scoring"] - push
    row = {
        "updates": len(updates),
        "accepted": sum(bool(u["accepted"]) for u in updates),
        "episodes_per_rollout": args.stage_prompts * args.stage_group,
        "total_s": round(total, 1),
        "rollout_s": round(bucket["rollout"], 1),
        "scoring_s": round(bucket["scoring"], 1),
        "update_s": round(update, 1),
        "adapter_push_s": round(push, 2),
        "evaluation_s": round(bucket["evaluation"], 1),
        "other_s": round(total - bucket["rollout"] - bucket["update_total"] - bucket["evaluation"], 1),
        "rollout_tokens": updates[-1]["train_tokens"],
        "max_logprob_gap": max(g["max"] for u in updates for g in u["rollout_logprob_gaps"].values()),
        "load": load(),
    }
    print(row, flush=True)
    return row


# ---- the team's own CPU per turn, no server ------------------------------------------------------------
def profile_team(model_dir: Path, args: argparse.Namespace) -> None:
    """`--profile-team`: the chain team over an engine that answers at once (a fixed 16-token completion,
    SmolLM2's tokenizer and chat template), so all the time is the team's per-turn work: LangGraph,
    LangChain, capture, chat-template rendering and tokenising. Prints CPU ms per turn, then cProfile's
    top functions by own time."""
    import cProfile
    import pstats

    from transformers import PreTrainedTokenizerFast

    from teamtr.graphs.engine import Generation

    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    completion = tok("The sum of 10 and 9 is 19, so we have 19+5.", add_special_tokens=False)["input_ids"][
        :16
    ]

    class Instant:
        streams_tokens = False

        def tokenizer(self, base: str = "base") -> Any:
            return tok

        async def generate(self, prompt_ids: list[int], *, adapter: str | None, **kw: Any) -> Generation:
            await asyncio.sleep(0)
            n = len(completion)
            return Generation(
                list(prompt_ids), completion, [-0.5] * n, tok.decode(completion), "length", adapter, 0
            )

    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.team_tokens)
    team = Team.from_engine(chain_roles(sampling=sampling), Instant(), name="chain")
    tasks = get_task("chain").generate(args.episodes, seed=0)
    team.run(tasks, seed=0)  # warm-up
    for _ in range(3):
        c0 = time.process_time()
        trajs = team.run(tasks, seed=0)
        turns = sum(len(t.turns) for t in trajs)
        print(
            f"team CPU per turn: {1000 * (time.process_time() - c0) / turns:.2f} ms ({turns} turns)",
            flush=True,
        )
    profiler = cProfile.Profile()
    profiler.enable()
    team.run(tasks, seed=0)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16, 32])
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--episodes", type=int, default=32, help="team episodes per rollout measurement")
    p.add_argument("--team-tokens", type=int, default=16, help="max tokens per team message")
    p.add_argument("--stage-prompts", type=int, default=4)
    p.add_argument("--stage-group", type=int, default=4)
    p.add_argument("--stage-lr", type=float, default=2.5e-4, help="examples/smollm2_team.yaml's; was 1e-3")
    p.add_argument("--skip", nargs="*", default=[], choices=["generation", "team", "stage"])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/real_model.json"))
    p.add_argument("--profile-team", action="store_true", help="only the team's CPU per turn, no server")
    args = p.parse_args()
    torch.set_num_threads(1)
    model_dir = Path(resolve_model("smollm2").path)
    if args.profile_team:
        profile_team(model_dir, args)
        return
    work = Path(tempfile.mkdtemp(prefix="bench-smollm2-"))
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "load_before": load()}
    print("load average before:", results["load_before"], flush=True)
    embedded = open_engine(EngineSpec(bases={"base": str(model_dir)}, device="cpu", threads=1)).engine
    adapters = write_role_adapters(embedded, work / "adapters")
    server = start_vllm_server(
        model_dir, max_loras=4, extra_args=["--max-model-len", "2048"], log_path=str(work / "vllm.log")
    )
    try:
        vllm = VLLMEngine({"base": server})

        async def load_roles() -> None:
            for role, path in adapters.items():
                await vllm.load_adapter(role, str(path))
            await vllm.aclose()

        asyncio.run(load_roles())
        if "generation" not in args.skip:
            results["generation"] = generation({"embedded": embedded, "vllm": vllm}, args)
        if "team" not in args.skip:
            results["team_rollouts"] = team_rollouts(vllm, server.url, args)
        del embedded  # the stage loads the trainer's own engine
        if "stage" not in args.skip:
            results["stage"] = teamtr_stage(model_dir, server, work, args)
    finally:
        server.stop()
    results["load_after"] = load()
    print("load average after:", results["load_after"], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"results -> {args.out}")


if __name__ == "__main__":
    main()
