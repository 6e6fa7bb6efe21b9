"""Heterogeneous teams and plug-and-play role replacement (Stage-0 alignment) on tiny real models.

A 2-role chain team trains on a task that rewards a final message starting with a digit (a random model
does that often enough to give groups a reward spread). Models are seconds-sized random Llamas.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, decoders, pre_tokenizers
from tokenizers import models as tok_models
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from teamtr.graphs.chain_team import chain_roles
from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.run_layout import read_metrics
from teamtr.training.config import TrainConfig
from tests.support.tiny_model import build_tiny_model
from tests.support.trainer_task import ODD_TASK, TASK  # the tasks register on import

torch.set_num_threads(1)

_team = types.ModuleType("teamtr_swap_test_team")
_team.roles = lambda: chain_roles(
    steps=2, sampling=SamplingParams(temperature=1.0, max_new_tokens=4, stop=("\n",))
)
sys.modules["teamtr_swap_test_team"] = _team


def run_config(model: str, run_dir: Path, **overrides) -> TrainConfig:
    base = {
        "run_dir": str(run_dir),
        "stages": 1,
        "task": {"name": TASK},
        "team": {"model": model, "lora_rank": 4, "roles": "teamtr_swap_test_team:roles"},
        "rollout": {"prompts_per_update": 3, "group_size": 4},
        "optim": {"lr": 5e-3, "epochs": 2, "minibatch_messages": 6},
        "trust_region": {"delta": 0.5, "probe_episodes": 16, "heldout_episodes": 8},  # test-sized checks
        "eval": {"stage_episodes": 4, "final_episodes": 4},
    }
    return TrainConfig.from_dict(base).with_overrides(overrides)


def train(cfg: TrainConfig) -> dict:
    from teamtr.training.trainer import Trainer

    return Trainer(cfg).train()


def shuffled_char_tokenizer() -> PreTrainedTokenizerFast:
    """The character tokenizer with another id order and extra tokens: a 'different family'."""
    from teamtr.training.tiny_models import CHAT_TEMPLATE, EOS, PAD, build_char_tokenizer

    chars = [c for c in build_char_tokenizer().get_vocab() if len(c) == 1]
    vocab = {"<extra_a>": 0, "<extra_b>": 1, PAD: 2, "<s>": 3, "<unused>": 4}
    for c in reversed(sorted(chars)):
        vocab[c] = len(vocab)
    vocab[EOS] = len(vocab)  # EOS last, not 2
    tok = Tokenizer(tok_models.WordLevel(vocab=vocab, unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token="<s>",
        eos_token=EOS,
        unk_token=PAD,
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
    )


def build_other_family(out_dir: Path, seed: int = 3) -> Path:
    from teamtr.training.tiny_models import tiny_llama_config

    torch.manual_seed(seed)
    tok = shuffled_char_tokenizer()
    config = tiny_llama_config(len(tok), hidden=64, layers=1, heads=2)
    config.pad_token_id, config.bos_token_id, config.eos_token_id = (
        tok.pad_token_id,
        tok.bos_token_id,
        tok.eos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("swap-models")
    return {
        "incumbent": str(build_tiny_model(root / "incumbent", seed=0)),
        "big": str(build_tiny_model(root / "big", seed=1, hidden=96, layers=2, heads=3)),
        "other": str(build_other_family(root / "other")),
    }


@pytest.fixture(scope="module")
def trained_run(models, tmp_path_factory) -> Path:
    """A 2-role team on the incumbent model after one TeamTR stage (stopped at a stage boundary)."""
    run_dir = tmp_path_factory.mktemp("run") / "run"
    train(run_config(models["incumbent"], run_dir))
    return run_dir


def test_heterogeneous_team_trains_an_update_for_each_role_on_its_own_base(models, tmp_path):
    cfg = run_config(
        models["incumbent"],
        tmp_path / "hetero",
        # a reward a random model earns half the time, so each role's update moves (makes a version)
        **{"team.bases": {"big": models["big"]}, "team.role_bases": {"adder2": "big"}, "task.name": ODD_TASK},
    )
    train(cfg)
    updates = read_metrics(cfg.run_dir, kind="update")
    assert sorted(u["role"] for u in updates) == ["adder1", "adder2"]
    assert all(u["messages"] > 0 and u["accepted"] for u in updates)
    # each role's saved adapter has the shapes of its own base: hidden 64 for adder1, 96 for adder2
    for role, hidden in (("adder1", 64), ("adder2", 96)):
        weights = load_file(Path(cfg.run_dir) / "adapters" / role / "v1" / "adapter_model.safetensors")
        q_a = next(v for k, v in weights.items() if "q_proj.lora_A" in k)
        assert q_a.shape[1] == hidden
    # `teamtr eval` on this run dir puts each role's newest adapter on the role's own base
    from teamtr.evals.teams import load_eval_team

    engine = load_eval_team(str(cfg.run_dir), TASK).engine
    assert engine.adapters("big") == ["adder2"] and engine.adapters() == ["adder1"]
    with pytest.raises(ValueError, match="unknown roles"):
        train(run_config(models["incumbent"], tmp_path / "bad", **{"team.role_bases": {"nobody": "big"}}))


def test_stage0_brings_the_monitored_kl_below_delta0(trained_run, models, tmp_path):
    from teamtr.training.swap import SwapConfig, swap_role

    # random tiny models: LoRA (rank 4) on the newcomer takes the KL from ~0.13 to a floor near 0.05
    delta0 = 0.075
    result = swap_role(
        trained_run,
        SwapConfig(
            role="adder2",
            model=models["big"],
            out=str(tmp_path / "aligned"),
            probes=32,
            delta0=delta0,
            max_rounds=8,
            minibatch=16,
            lr=1e-2,
        ),
    )
    assert result.divergence == "token"
    assert result.kl_history[0] > delta0  # the newcomer started outside the region ...
    assert result.converged and result.kl_final <= delta0  # ... and Stage-0 brought it inside
    swaps = read_metrics(result.out_dir, kind="swap")
    assert swaps[-1]["kl_final"] == pytest.approx(result.kl_final)

    # a direct swap of the same newcomer measures the KL but does not move it
    direct = swap_role(
        trained_run,
        SwapConfig(role="adder2", model=models["big"], out=str(tmp_path / "direct"), probes=32, align=False),
    )
    assert direct.rounds == 0 and direct.kl_final > delta0


def _engine_of(run_dir: Path):
    from teamtr.training.checkpoint import load_latest_checkpoint
    from teamtr.training.run_dir import RunDir
    from teamtr.training.swap import team_engine

    run = RunDir(run_dir)
    ckpt = load_latest_checkpoint(run_dir)
    return team_engine(run, ckpt), run.roles, ckpt


def _greedy(engine, role, contexts: list[list[int]]) -> list[list[int]]:
    import asyncio

    sampling = SamplingParams(temperature=0.0, max_new_tokens=4, stop=("\n",))

    async def go():
        return await asyncio.gather(
            *(
                engine.generate(p, adapter=role.adapter, sampling=sampling, base=role.base_model)
                for p in contexts
            )
        )

    return [g.completion_ids for g in asyncio.run(go())]


def test_after_a_swap_the_newcomer_serves_exactly_that_role(trained_run, models, tmp_path):
    from teamtr.training.swap import SwapConfig, swap_role

    result = swap_role(
        trained_run,
        SwapConfig(role="adder2", model=models["big"], out=str(tmp_path / "new"), probes=16, max_rounds=2),
    )
    old_engine, old_roles, old_ckpt = _engine_of(trained_run)
    new_engine, new_roles, new_ckpt = _engine_of(result.out_dir)
    old = {r.name: r for r in old_roles}
    new = {r.name: r for r in new_roles}
    assert new["adder2"].base_model == result.base_name != old["adder2"].base_model
    assert new_engine.base_path(result.base_name) == str(Path(models["big"]).resolve())
    assert new["adder1"].base_model == old["adder1"].base_model
    # the other role: same adapter weights, same version, same greedy messages
    for k, w in old_ckpt.adapters["adder1"].items():
        assert torch.equal(new_ckpt.adapters["adder1"][k], w)
    assert new_ckpt.state["versions"]["adder1"] == old_ckpt.state["versions"]["adder1"]
    contexts = [old_engine.tokenizer().encode(f"Add the first two numbers.\n{i}+{i + 3}\n") for i in range(6)]
    assert _greedy(new_engine, new["adder1"], contexts) == _greedy(old_engine, old["adder1"], contexts)
    # the swapped role: a new version on the newcomer's base, whose adapter is the aligned one
    assert new_ckpt.state["versions"]["adder2"] == old_ckpt.state["versions"]["adder2"] + 1
    saved = load_file(
        result.out_dir / "adapters" / "adder2" / f"v{result.new_version}" / "adapter_model.safetensors"
    )
    assert next(v for k, v in saved.items() if "q_proj.lora_A" in k).shape[1] == 96
    assert "adder2" not in new_ckpt.optimizers and "adder1" in new_ckpt.optimizers

    # `teamtr train` continues from the new directory: both roles update, adder2 on the newcomer's base
    summary = train(TrainConfig.from_yaml(result.out_dir / "config.yaml"))
    assert summary["stages"] == 1 + 3  # the old stage + the new run's extra stages
    updates = [u for u in read_metrics(result.out_dir, kind="update") if u["stage"] >= 2]
    assert {u["role"] for u in updates} == {"adder1", "adder2"}
    assert all(u["batch_versions"]["adder2"] >= result.new_version for u in updates)
    assert len(read_metrics(result.out_dir, kind="stage")) == 4  # the old stage's record is kept


def test_a_newcomer_with_another_tokenizer_works_end_to_end(trained_run, models, tmp_path):
    from teamtr.training.swap import SwapConfig, swap_role

    result = swap_role(
        trained_run,
        SwapConfig(
            role="adder1",
            model=models["other"],
            out=str(tmp_path / "other"),
            probes=32,
            delta0=1e-6,  # unreachable: run every round, so the text-mode loop is exercised
            max_rounds=6,
            minibatch=16,
            lr=2e-2,
            extra_stages=1,
        ),
    )
    assert result.divergence == "text"
    assert all(k >= 0 for k in result.kl_history)  # the k3 form is >= 0 per message
    assert min(result.kl_history[1:]) < result.kl_history[0]  # Stage-0 moved the newcomer towards the team
    assert not result.converged
    # at the round cap the adapter of the closest round is kept: its KL is the final value
    assert result.kl_final == min(result.kl_history[:7])
    summary = train(TrainConfig.from_yaml(result.out_dir / "config.yaml"))
    assert summary["stages"] == 2
    updates = [u for u in read_metrics(result.out_dir, kind="update") if u["stage"] == 2]
    assert {u["role"] for u in updates} == {"adder1", "adder2"}


def test_swap_refuses_bad_input(trained_run, models, tmp_path):
    from teamtr.training.swap import SwapConfig, swap_role

    with pytest.raises(ValueError, match="unknown role"):
        swap_role(trained_run, SwapConfig(role="nobody", model=models["big"], out=str(tmp_path / "x")))
    with pytest.raises(FileNotFoundError, match="not a model directory"):
        swap_role(trained_run, SwapConfig(role="adder1", model=str(tmp_path), out=str(tmp_path / "y")))
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        swap_role(tmp_path, SwapConfig(role="adder1", model=models["big"], out=str(tmp_path / "z")))
    with pytest.raises(ValueError, match="delta0"):
        SwapConfig(role="adder1", model=models["big"], delta0=0)


def test_cli_swap_writes_a_run_directory_and_reports_bad_input(trained_run, models, tmp_path):
    import json

    from typer.testing import CliRunner

    from teamtr.cli.main import app

    runner = CliRunner()
    out = tmp_path / "cli"
    args = ["swap", str(trained_run), "--role", "adder1", "--model", models["big"], "--out", str(out)]
    result = runner.invoke(app, [*args, "--probes", "8", "--max-rounds", "1", "--json"])
    assert result.exit_code == 0, result.output
    # the JSON object is the last line (model loading may print progress bars before it, without newline)
    last = result.output.strip().splitlines()[-1]
    record = json.loads(last[last.index("{") :])
    assert record["role"] == "adder1" and record["probes"] == 8 and len(record["kl_history"]) >= 1
    assert TrainConfig.from_yaml(out / "config.yaml").team.role_bases == {"adder1": record["base_name"]}
    bad = runner.invoke(app, ["swap", str(trained_run), "--role", "nobody", "--model", models["big"]])
    assert bad.exit_code != 0 and "unknown role" in bad.output
    again = runner.invoke(app, args)  # the output directory is not empty now
    assert again.exit_code != 0 and "not empty" in again.output


def test_mixture_target_pulls_the_newcomer_towards_the_incumbent(trained_run, models, tmp_path):
    from teamtr.training.swap import SwapConfig, swap_role

    result = swap_role(
        trained_run,
        SwapConfig(
            role="adder2",
            model=models["big"],
            out=str(tmp_path / "mixture"),
            probes=32,
            delta0=1e-6,
            max_rounds=3,
            minibatch=16,
            target="mixture",
            mixture_lambda=3.0,
            lr=1e-2,
        ),
    )
    assert result.extra["target"] == "mixture"
    # the geometric mixture lies between the newcomer and the incumbent: the KL to the incumbent falls
    assert min(result.kl_history[1:]) < result.kl_history[0]


def test_a_role_swapped_twice_drops_the_base_no_role_uses(trained_run, models, tmp_path):
    from teamtr.training.swap import SwapConfig, swap_role

    quick = {"probes": 8, "max_rounds": 1, "extra_stages": 0}
    first = swap_role(
        trained_run, SwapConfig(role="adder2", model=models["big"], out=str(tmp_path / "one"), **quick)
    )
    second = swap_role(
        first.out_dir,
        SwapConfig(role="adder2", model=models["incumbent"], out=str(tmp_path / "two"), **quick),
    )
    assert (first.base_name, second.base_name) == ("adder2-swap1", "adder2-swap2")
    cfg = TrainConfig.from_yaml(second.out_dir / "config.yaml")
    assert cfg.team.bases == {"adder2-swap2": str(Path(models["incumbent"]).resolve())}
    assert cfg.team.role_bases == {"adder2": "adder2-swap2"}
    assert second.new_version == first.new_version + 1
    # the second swap's incumbent was the first newcomer: its held-out return is the one the first wrote
    assert second.eval_before == pytest.approx(first.eval_after)


@pytest.mark.parametrize(("newcomer", "mode"), [("big", "token"), ("other", "text")])
def test_protocol_unification_fits_the_incumbents_messages(trained_run, models, tmp_path, newcomer, mode):
    from teamtr.training.swap import SwapConfig, swap_role

    result = swap_role(
        trained_run,
        SwapConfig(
            role="adder1",
            model=models[newcomer],
            out=str(tmp_path / newcomer),
            probes=16,
            delta0=1e-6,
            max_rounds=1,  # round 0 = unification only
            minibatch=8,
            lr=1e-2,
            unify_epochs=4,
        ),
    )
    assert result.divergence == mode
    before, after = result.extra["unify_nll"]
    # the newcomer's NLL of the incumbent's own messages (in its own tokens, for another tokenizer) fell
    assert after < before
    assert read_metrics(result.out_dir, kind="swap")[-1]["extra"]["unify_nll"] == [before, after]
