"""`rollout.engine: vllm`: one TeamTR stage whose rollouts a real vLLM server samples
(training/vllm_rollouts.py).

The team and task are tests/training/test_trainer.py's (the chain team's three roles, reward for a
final message starting with a digit) on the session's tiny vLLM model (tests/conftest.py), which
the trainer's embedded engine loads too. What must hold:

- every rollout after role i's accepted update records role i's new version, and vLLM sampled it with
  the new weights: the log-probs it recorded for role i's turns equal the trainer's at the new weights;
- the gap between vLLM's recorded log-probs and the trainer's recomputed ones stays below GAP_BOUND for
  every role's turns (float32 on both sides: only the order of summation differs, ~1e-6 here);
- the adapters saved (and pushed) are the trainer's parameters, and vLLM serves the last of them;
- a fresh rollout engine (a resumed run's) records the trainer's versions of what it pushed, whatever
  the server held before, and refuses to sample an adapter it never pushed;
- an attach URL for a team on two bases, or one nobody answers at, is one RunDirError before training.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from teamtr.engines.embedded import EmbeddedEngine
from teamtr.engines.open import serving_lora_rank
from teamtr.engines.random_adapters import random_lora_adapter
from teamtr.engines.vllm_engine import VLLMEngine
from teamtr.engines.vllm_server import VLLMServer
from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.run_layout import read_metrics
from teamtr.training.run_dir import RunDir, RunDirError
from teamtr.training.trainer import Trainer
from teamtr.training.vllm_rollouts import VLLMRollouts
from tests.support.trainer import small_config

torch.set_num_threads(1)
GAP_BOUND = 1e-4  # |vLLM log-prob - trainer's log-prob| per token, float32 on both sides
TEMPERATURE = 0.7  # tempered rollouts: vLLM's processed log-probs must be those of pi_T


def saved_adapters(run_dir: Path, adapter: str) -> dict[int, Path]:
    return {int(p.name[1:]): p for p in (run_dir / "adapters" / adapter).glob("v*") if p.name[1:].isdigit()}


@pytest.mark.vllm
@pytest.mark.slow
def test_a_teamtr_stage_with_vllm_rollouts_pushes_each_accepted_adapter(
    vllm_model_dir: Path, vllm_server: VLLMServer, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    cfg = small_config(
        str(vllm_model_dir),
        run_dir,
        **{
            "schedule.kind": "teamtr",
            "rollout.engine": "vllm",
            "rollout.vllm_url": vllm_server.url,
            "rollout.temperature": TEMPERATURE,
            "rollout.prompts_per_update": 2,
            "rollout.group_size": 4,
            "trust_region.heldout_episodes": 2,
            "optim.optimizer": "adamw",  # a visible move at this lr: RAdam's first steps are small
            "trust_region.delta": 0.5,
            "eval.stage_episodes": 2,
        },
    )
    trainer = Trainer(cfg)
    summary = trainer.train()
    updates = read_metrics(run_dir, kind="update")

    assert [u["index"] for u in updates] == [1, 2, 3]
    assert all(u["rollout_engine"] == "vllm" for u in updates)
    accepted = [u for u in updates if u["accepted"]]
    assert accepted, "no update accepted: nothing was pushed"
    for u in accepted:
        assert u["version_after"] == u["versions_before"][u["adapter"]] + 1
        assert u["adapter_push_seconds"] is not None and u["adapter_push_seconds"] > 0

    # (a) the resample after each update records the pushed version of every role updated so far...
    for prev, cur in zip(updates, updates[1:], strict=False):
        assert cur["batch_turn_versions"][prev["adapter"]] == [prev["version_after"]]
    for u in updates:
        assert u["batch_turn_versions"] == {a: [v] for a, v in u["versions_before"].items()}
        # ... and vLLM sampled every role with the weights the trainer holds at that version
        gaps = u["rollout_logprob_gaps"]
        assert set(gaps) == set(u["versions_before"])
        assert all(g["max"] < GAP_BOUND and g["tokens"] > 0 for g in gaps.values()), gaps
        # (b) the update's own gap (log pi_cur recomputed by the trainer vs vLLM's behaviour log-probs)
        assert u["logprob_gap"] <= u["logprob_gap_max"] < GAP_BOUND

    worst = max(g["max"] for u in updates for g in u["rollout_logprob_gaps"].values())
    assert summary["rollout_logprob_gap_max"] == worst  # the run record reports it
    print(
        f"max |vLLM - trainer| log-prob gap {worst:.2e}; "
        f"push s {[u['adapter_push_seconds'] for u in updates]}"
    )

    # (c) the saved versions are the trainer's parameters, and vLLM serves the newest of them
    engine = trainer.engine
    moved = []
    for role in trainer.roles:
        versions = saved_adapters(run_dir, role.adapter)
        newest = max(versions)
        assert newest == engine.adapter_version(role.adapter)
        saved = load_file(versions[newest] / "adapter_model.safetensors")
        params = {
            k.replace(f".{role.adapter}.weight", ".weight"): p
            for k, p in engine.adapter_parameters(role.adapter).items()
        }
        assert set(saved) == set(params)
        assert all(torch.equal(saved[k], params[k].detach()) for k in saved)
        if newest > 0:
            moved.append((role.adapter, versions[0], versions[newest]))
    assert moved

    # what vLLM samples for an updated role now is the newest version, by a margin the bound resolves
    adapter, v0_dir, newest_dir = moved[0]
    vllm = VLLMEngine({"base": vllm_server})
    ids = vllm.tokenizer()("3+4+5")["input_ids"]
    sampling = SamplingParams(temperature=TEMPERATURE, max_new_tokens=8, seed=11)
    gen = asyncio.run(vllm.generate(ids, adapter=adapter, sampling=sampling))
    vllm.close()
    reference = EmbeddedEngine(str(vllm_model_dir), adapters={"new": str(newest_dir), "old": str(v0_dir)})
    [new] = reference.score([ids], [gen.completion_ids], "new")
    [old] = reference.score([ids], [gen.completion_ids], "old")
    recorded = torch.tensor(gen.logprobs)
    tempered_new = torch.tensor(reference_tempered(reference, ids, gen.completion_ids, "new"))
    assert (recorded - tempered_new).abs().max() < GAP_BOUND
    assert (torch.tensor(new) - torch.tensor(old)).abs().max() > 100 * GAP_BOUND  # a stale push would show


@torch.no_grad()
def reference_tempered(
    engine: EmbeddedEngine, prompt: list[int], completion: list[int], adapter: str
) -> list[float]:
    [lp] = engine.token_logprobs([prompt], [completion], adapter, temperature=TEMPERATURE)
    return lp.tolist()


def test_vllm_rollout_settings_that_cannot_work_are_one_error_before_training(
    vllm_model_dir: Path, tmp_path: Path
) -> None:
    tiny_model = str(vllm_model_dir)  # only built: no server is asked for
    two_bases = {"team.bases": {"other": tiny_model}, "team.role_bases": {"adder2": "other"}}
    cases = {
        "rollout.vllm_url attaches one server, but the team sits on 2 bases": two_bases,
        "cannot reach a vLLM server at http://127.0.0.1:9": {},
    }
    for message, overrides in cases.items():
        cfg = small_config(tiny_model, tmp_path / f"run{len(overrides)}", **overrides)
        cfg = cfg.with_overrides({"rollout.engine": "vllm", "rollout.vllm_url": "http://127.0.0.1:9"})
        run = RunDir.create(cfg)
        with pytest.raises(RunDirError, match=message):
            run.rollout_engine(run.engine("fresh"))
    # the launcher's --max-lora-rank: a rank vLLM accepts that holds the run's adapters
    assert [serving_lora_rank(r) for r in (4, 8, 16, 17, 64, 100)] == [16, 16, 16, 32, 64, 128]


@pytest.mark.vllm
def test_a_fresh_rollout_engine_records_the_trainers_versions_of_what_it_pushed(
    vllm_model_dir: Path, vllm_server: VLLMServer, tmp_path: Path
) -> None:
    """A resumed run's situation: a new VLLMRollouts on a server that may hold the adapter already, at
    trainer versions far from VLLMEngine's own count (0 at its first load)."""
    first = random_lora_adapter(vllm_model_dir, tmp_path / "v7", seed=1)
    second = random_lora_adapter(vllm_model_dir, tmp_path / "v8", seed=2)
    rollouts = VLLMRollouts(VLLMEngine({"base": vllm_server}))
    reference = EmbeddedEngine(str(vllm_model_dir), adapters={"v7": str(first), "v8": str(second)})
    ids = rollouts.tokenizer()("1+2+3")["input_ids"]
    sampling = SamplingParams(temperature=TEMPERATURE, max_new_tokens=8, seed=5)
    try:
        with pytest.raises(KeyError, match="never pushed"):  # not sampled from whatever the server holds
            asyncio.run(rollouts.generate(ids, adapter="resumed-role", sampling=sampling))
        for version, weights in ((7, "v7"), (8, "v8")):
            rollouts.push("resumed-role", tmp_path / weights, version)
            gen = asyncio.run(rollouts.generate(ids, adapter="resumed-role", sampling=sampling))
            assert gen.adapter_version == version == rollouts.adapter_version("resumed-role")
            expected = torch.tensor(reference_tempered(reference, ids, gen.completion_ids, weights))
            assert (torch.tensor(gen.logprobs) - expected).abs().max() < GAP_BOUND
        assert rollouts.sync({("base", "resumed-role"): (8, second)}) == []  # vLLM serves v8 already
        assert rollouts.sync({("base", "resumed-role"): (7, first)}) == ["resumed-role"]
        assert rollouts.adapter_version("resumed-role") == 7
    finally:
        rollouts.close()  # attached: the session's server keeps running
    assert vllm_server.is_running()
