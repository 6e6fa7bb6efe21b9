"""The held-out KL check (training/diagnostics.py OutOfSampleKL): KL(pi_cur || pi_new) of
the updated role on held-out contexts, the exact vocabulary sum per message. It equals a brute-force KL
computed here prefix by prefix, is 0 for a rejected update and positive for an accepted one, reaches the
metrics and the run summary, and does not change the training trajectory of a seeded run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math

import pytest
import torch
from safetensors.torch import load_file

from teamtr.engines.embedded import EmbeddedEngine, LoraSettings
from teamtr.engines.random_adapters import randomise_lora_b
from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.run_layout import read_metrics
from teamtr.graphs.trajectory import Trajectory, Turn
from teamtr.training.diagnostics import OutOfSampleKL
from teamtr.training.policy import AdapterPolicy
from tests.support.trainer import (  # importing it registers the trainer tests' task
    small_config,
    stage_team,
    train,
)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    from teamtr.training.warmstart import tiny_random_model

    return str(tiny_random_model(tmp_path_factory.mktemp("tiny") / "model"))


def _policy(engine: EmbeddedEngine, adapter: str, temperature: float) -> AdapterPolicy:
    params = engine.adapter_parameters(adapter)
    return AdapterPolicy(
        engine, adapter, "base", params, torch.optim.AdamW(list(params.values())), temperature
    )


def _held_out(engine: EmbeddedEngine, adapter: str, temperature: float, n: int) -> list[Trajectory]:
    tok = engine.tokenizer()
    sampling = SamplingParams(temperature=temperature, max_new_tokens=5)
    out = []
    for i in range(n):
        ids = tok(f"{i}+{i + 2}=")["input_ids"]
        gen = asyncio.run(
            engine.generate(ids, adapter=adapter, sampling=dataclasses.replace(sampling, seed=i))
        )
        turn = Turn("r", adapter, 0, ids, gen.completion_ids, gen.logprobs, gen.text, temperature=temperature)
        out.append(Trajectory(f"t{i}", [turn]))
    return out


def _brute_force_kl(engine: EmbeddedEngine, adapter: str, cur: dict, new: dict, prompt, completion, t: float):
    """sum_u sum_v pi_cur(v|prefix_u) log(pi_cur / pi_new), one unpadded forward per prefix, in float64."""
    model = engine.model()
    model.set_adapter(adapter)
    total = 0.0
    for u in range(len(completion)):
        ids = torch.tensor([list(prompt) + list(completion[:u])])
        dists = []
        for weights in (cur, new):
            engine.restore_adapter(adapter, weights)
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0, -1].double()
            dists.append(torch.log_softmax(logits / t, dim=-1))
        p, q = dists
        total += float((p.exp() * (p - q)).sum())
    engine.restore_adapter(adapter, new)
    return total


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_heldout_kl_equals_a_brute_force_vocabulary_kl(tiny_model_dir, temperature):
    engine = EmbeddedEngine(tiny_model_dir, adapters={"a": None}, lora=LoraSettings(r=4), threads=1)
    policy = _policy(engine, "a", temperature)
    held_out = _held_out(engine, "a", temperature, n=3)
    monitor = OutOfSampleKL.before(held_out, "r", policy)
    cur = policy.weights()
    torch.manual_seed(0)
    randomise_lora_b(policy.params, std=0.2)  # pi_new: a nonzero LoRA update
    new = policy.weights()
    got = monitor.per_message()
    assert got.shape == (3,)
    for i, traj in enumerate(held_out):
        turn = traj.turns[0]
        expected = _brute_force_kl(engine, "a", cur, new, turn.prompt_ids, turn.completion_ids, temperature)
        assert expected > 1e-4
        assert float(got[i]) == pytest.approx(expected, rel=1e-4, abs=1e-7)
    # pi_new is back in place, bit for bit, after the monitor scored pi_cur
    for k, p in policy.params.items():
        assert torch.equal(p.detach(), new[k])
    fields = monitor.after(delta=0.0, per_token=False)
    assert fields["kl_out_of_sample"] == pytest.approx(float(got.mean()))
    tokens = sum(len(t.turns[0].completion_ids) for t in held_out)
    assert fields["kl_out_of_sample_token"] == pytest.approx(float(got.sum()) / tokens)
    assert fields["kl_out_of_sample_messages"] == 3 and fields["left_region_out_of_sample"] is True
    assert monitor.after(delta=1e9, per_token=False)["left_region_out_of_sample"] is False


def test_heldout_kl_is_zero_for_a_rejected_update_and_positive_for_an_accepted_one(tiny_model, tmp_path):
    from teamtr.training.stage import UpdateContext

    cfg = small_config(tiny_model, tmp_path / "run", **{"trust_region.heldout_episodes": 4})
    team = stage_team(cfg, tiny_model)
    batch = team.rollout(0, 0)
    accepted = team.update(UpdateContext(0, 1, "adder1", batch, batch, fresh=True, reweight=False))
    assert accepted.accepted
    assert accepted.record["kl_out_of_sample_messages"] == 4
    assert accepted.record["kl_out_of_sample"] > 0 and accepted.record["kl_out_of_sample_token"] > 0
    assert accepted.record["heldout_tokens"] > 0
    # the held-out episodes are not the training batch: their contexts are other prompts
    assert accepted.record["train_tokens"] == batch.completion_tokens

    cfg.optim.lr, cfg.trust_region.delta, cfg.trust_region.max_backtracks = 0.5, 1e-9, 1
    rejected = team.update(UpdateContext(0, 2, "adder2", batch, batch, fresh=True, reweight=False))
    assert not rejected.accepted
    assert rejected.record["kl_out_of_sample"] == 0.0
    assert rejected.record["left_region_out_of_sample"] is False


def final_adapters(run_dir):
    out = {}
    for role_dir in sorted((run_dir / "adapters").iterdir()):
        for version in sorted(role_dir.iterdir()):
            out[f"{role_dir.name}/{version.name}"] = load_file(version / "adapter_model.safetensors")
    return out


def test_heldout_kl_reaches_metrics_and_summary_and_leaves_the_seeded_run_unchanged(tiny_model, tmp_path):
    on = small_config(tiny_model, tmp_path / "on", stages=2, **{"trust_region.heldout_episodes": 3})
    off = small_config(tiny_model, tmp_path / "off", stages=2, **{"trust_region.heldout_episodes": 0})
    updates_on, updates_off = train(on), train(off)
    # the monitor draws nothing from the training random state: same adapters, same updates
    a_on, a_off = final_adapters(tmp_path / "on"), final_adapters(tmp_path / "off")
    assert a_on.keys() == a_off.keys()
    for name in a_on:
        for k in a_on[name]:
            assert torch.equal(a_on[name][k], a_off[name][k]), f"{name} {k}"
    assert [u["d_hat"] for u in updates_on] == [u["d_hat"] for u in updates_off]
    assert [u["train_tokens"] for u in updates_on] == [u["train_tokens"] for u in updates_off]

    assert all(u["kl_out_of_sample"] is None and u["heldout_tokens"] == 0 for u in updates_off)
    assert any(u["no_signal"] for u in updates_on) and not all(u["no_signal"] for u in updates_on)
    for u in updates_on:
        # an update without signal changes nothing: no held-out episode is sampled for its exact 0
        assert u["kl_out_of_sample_messages"] == (0 if u["no_signal"] else 3)
        # positive exactly when the update moved the policy (an accepted update whose groups all had zero
        # advantage leaves the weights where they were: in-sample k3 and the monitor are then both 0)
        moved = u["accepted"] and u["kl_k3_message"] > 0
        assert (u["kl_out_of_sample"] > 0) == moved and u["kl_out_of_sample"] >= 0
        assert u["left_region_out_of_sample"] == (u["kl_out_of_sample"] > u["delta"])
    run_on = read_metrics(tmp_path / "on", "run")[-1]
    flags = [u["left_region_out_of_sample"] for u in updates_on]
    assert run_on["left_region_out_of_sample_fraction"] == pytest.approx(sum(flags) / len(flags))
    assert run_on["kl_out_of_sample_mean"] == pytest.approx(
        sum(u["kl_out_of_sample"] for u in updates_on) / len(updates_on)
    )
    assert "left_region_fraction" in run_on and run_on["heldout_tokens"] > 0
    run_off = read_metrics(tmp_path / "off", "run")[-1]
    assert run_off["left_region_out_of_sample_fraction"] is None and run_off["heldout_tokens"] == 0
    assert math.isfinite(run_on["kl_out_of_sample_mean"])
