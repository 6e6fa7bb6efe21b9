"""One TeamTR stage on SmolLM2-135M-Instruct with its rollouts sampled by the real vLLM server:
`rollout.engine: vllm` attached to the session's SmolLM2 server (tests/conftest.py).

The team and task are examples/smollm2_team.py's (a solver and a checker on `sum_of_two`, sampled at
T = 0.5, where SmolLM2 is right often enough for the groups to have a spread, so the updates move the
adapters; at T = 1 it rarely is: docs/models.md). The smallest stage that shows the point: 2 prompts x 4 episodes per
rollout, one epoch, LoRA rank 4 on q_proj / v_proj, no held-out evaluation. What must hold:

- every accepted update saved and pushed its adapter (push seconds recorded), and the resample after it
  recorded that version for the role's turns: the next update's batch was sampled on the pushed adapter;
- vLLM sampled every role with the weights the trainer held at the recorded version: the log-probs vLLM
  recorded for each role's turns equal the trainer's (float32 both sides) within TOLERANCE;
- after the stage, what vLLM samples for an updated role is the newest version, by a margin the
  tolerance resolves (a stale push would show).

Wall time and the measured gap: docs/models.md ("Training through vLLM on SmolLM2").
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from teamtr.engines.vllm_engine import VLLMEngine
from teamtr.engines.vllm_server import VLLMServer
from teamtr.graphs.engine import DEFAULT_BASE, SamplingParams
from teamtr.graphs.run_layout import read_metrics
from teamtr.training.trainer import Trainer
from tests.support.trainer import small_config

torch.set_num_threads(1)
ADAPTERS = ("solver", "checker")
TOLERANCE = 1e-3  # nats per token, as tests/engines/test_real_model.py (30 float32 layers, two kernel orders)
TEMPERATURE = 0.5  # the example's (examples/smollm2_team.yaml)


@pytest.mark.slow
@pytest.mark.vllm
def test_a_teamtr_stage_on_smollm2_samples_each_pushed_adapter_through_vllm(
    smollm2_model_dir: Path, smollm2_vllm_server: VLLMServer, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    cfg = small_config(
        str(smollm2_model_dir),
        run_dir,
        **{
            "task.name": "sum_of_two",
            "task.data": "examples.smollm2_team:task_family",  # imported from the repository root
            "team.roles": "examples.smollm2_team:roles",
            "schedule.kind": "teamtr",
            "team.lora_rank": 4,
            "team.lora_targets": ["q_proj", "v_proj"],
            "team.device": "cpu",
            "rollout.engine": "vllm",
            "rollout.vllm_url": smollm2_vllm_server.url,
            "rollout.temperature": TEMPERATURE,
            "rollout.prompts_per_update": 2,
            "rollout.group_size": 4,
            "optim.lr": 2e-3,
            "optim.epochs": 1,
            "optim.minibatch_messages": 4,
            "trust_region.delta": 5.0,  # the plumbing is tested here, not the trust region
            "trust_region.heldout_episodes": 0,
            # plumbing, not the trust region: checked on the batch (no probe episodes to sample), and AdamW
            # moves the adapter visibly at this lr (RAdam's first steps are small momentum-SGD ones)
            "trust_region.check": "sampled",
            "optim.optimizer": "adamw",
            "eval.stage_episodes": 0,
        },
    )
    trainer = Trainer(cfg)
    try:
        trainer.train()
        updates = read_metrics(run_dir, kind="update")

        assert [u["index"] for u in updates] == [1, 2]
        assert all(u["rollout_engine"] == "vllm" for u in updates)
        accepted = [u for u in updates if u["accepted"]]
        assert accepted, "no update accepted: nothing was pushed"
        for u in accepted:
            assert u["version_after"] == u["versions_before"][u["adapter"]] + 1
            assert u["adapter_push_seconds"] is not None and u["adapter_push_seconds"] > 0
        # the resample after update i recorded the version update i pushed (every turn of that role)
        for prev, cur in zip(updates, updates[1:], strict=False):
            assert cur["batch_turn_versions"][prev["adapter"]] == [prev["version_after"]]
        for u in updates:
            assert u["batch_turn_versions"] == {a: [v] for a, v in u["versions_before"].items()}
            gaps = u["rollout_logprob_gaps"]  # vLLM's recorded log-probs vs the trainer's, per role
            assert set(gaps) == set(ADAPTERS)
            assert all(g["max"] < TOLERANCE and g["tokens"] > 0 for g in gaps.values()), gaps
        worst = max(g["max"] for u in updates for g in u["rollout_logprob_gaps"].values())
        pushes = [u["adapter_push_seconds"] for u in updates]
        print(f"max |vLLM - trainer| log-prob gap {worst:.2e}; push s {pushes}")

        # vLLM now samples an updated role with its newest version, not v0: the trainer's scores of
        # vLLM's tokens under the newest weights match what vLLM recorded, those under v0 do not
        moved = [a for a in ADAPTERS if _saved(run_dir, a, -1) != _saved(run_dir, a, 0)]
        assert moved, f"no adapter moved; rewards {[u['reward'] for u in updates]}"
        adapter = moved[0]
        engine = trainer.engine
        engine.load_adapter_sync("v0-reference", run_dir / "adapters" / adapter / "v0")
        vllm = VLLMEngine({DEFAULT_BASE: smollm2_vllm_server})
        ids = vllm.tokenizer()(" 3+4")["input_ids"]
        sampling = SamplingParams(temperature=TEMPERATURE, max_new_tokens=8, seed=3)
        gen = asyncio.run(vllm.generate(ids, adapter=adapter, sampling=sampling))
        vllm.close()
        with torch.no_grad():  # vLLM records log pi_T (processed log-probs): score at the same T
            [new], [old] = (
                engine.token_logprobs([ids], [gen.completion_ids], name, temperature=TEMPERATURE)
                for name in (adapter, "v0-reference")
            )
        assert (torch.tensor(gen.logprobs) - new).abs().max() < TOLERANCE
        assert (new - old).abs().max() > 10 * TOLERANCE
    finally:
        _unload(smollm2_vllm_server)  # free the server's adapter slots for the other SmolLM2 tests


def _saved(run_dir: Path, adapter: str, index: int) -> bytes:
    """The safetensors bytes of the adapter's saved version number `index` in version order (-1: newest)."""
    versions = sorted(
        (p for p in (run_dir / "adapters" / adapter).glob("v*") if p.name[1:].isdigit()),
        key=lambda p: int(p.name[1:]),
    )
    return (versions[index] / "adapter_model.safetensors").read_bytes()


def _unload(server: VLLMServer) -> None:
    engine = VLLMEngine({DEFAULT_BASE: server})

    async def unload() -> None:
        try:
            served = set(await engine.served_models())
            for adapter in ADAPTERS:
                if adapter in served:
                    await engine.unload_adapter(adapter)
        finally:
            await engine.aclose()

    asyncio.run(unload())
    engine.close()
