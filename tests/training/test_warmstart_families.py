"""Warm starts of every task family: demonstrations that verify, rendered as rollouts render them,
a short build of a non-chain family, the chain demo's cache key, and `eval warm` / the trainer
resolving a family's own warm model."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
from typer.testing import CliRunner

from teamtr.evals.teams import load_eval_team
from teamtr.graphs.chat_format import render_prompt_ids
from teamtr.graphs.roles import role_messages
from teamtr.tasks import get_task, task_names
from teamtr.tasks.roles import default_roles, with_private_view
from teamtr.training.tiny_models import MESSAGE_END, build_char_tokenizer
from teamtr.training.warmstart import (
    FAMILY_SETTINGS,
    WarmStartConfig,
    build_warm_model,
    episode_examples,
    evaluate_team,
    is_complete,
    load_report,
    new_model,
    warm_config_for,
    warm_team,
)

torch.set_num_threads(int(os.environ.get("TEAMTR_TORCH_THREADS", "1")))

FAMILIES = ["arbench", "autologi", "blocksworld", "convention", "countdown", "split", "zebra"]  # built in (tests add more)
# WarmStartConfig().cache_key(), pinned so that it changes only on purpose (a new key rebuilds every
# cached demo model). It was e1ceb7ad539e8483 until the build became deterministic (WARMSTART_FORMAT 2).
CHAIN_DEMO_KEY = "ca8fc300b51806dc"


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def tiny_family_config(task: str, **overrides) -> WarmStartConfig:
    base = dict(hidden=64, layers=2, heads=2, batch_size=4, max_steps=2, eval_every=1, eval_tasks=3,
                final_eval_tasks=3, sampled_eval_tasks=2, samples_per_task=2, threads=1)  # fmt: skip
    base.update(overrides)
    return warm_config_for(task, **base)


def test_every_family_has_a_warm_start_config():
    # relay's demonstrations are drawn with slips and its roles speak unevenly: tests/tasks/test_relay.py
    assert sorted(FAMILY_SETTINGS) == sorted([*FAMILIES, "relay"])
    assert set(FAMILIES) | {"chain"} <= set(task_names())
    for name in FAMILIES:
        cfg = warm_config_for(name)
        family, team = warm_team(cfg)
        assert cfg.task == name and family.name == name
        assert [r.system_prompt for r in team.roles] == [family.system_prompt] * cfg.steps
        assert [r.name for r in team.roles] == [r.name for r in default_roles(name, cfg.steps)]


@pytest.mark.parametrize("name", FAMILIES)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6))
def test_demonstrated_transcript_is_verified_correct(name, seed):
    family, team = warm_team(warm_config_for(name))
    for inst in family.generate(3, seed):
        transcript = [team.demonstration(inst, k) for k in range(len(team.roles))]
        assert family.verify(inst, transcript[-1]) == 1.0
        assert all(team.message_ok(inst, k, m) for k, m in enumerate(transcript))
        assert all(MESSAGE_END not in m and m for m in transcript)  # one line: the engine stops at "\n"


@pytest.mark.parametrize("name", FAMILIES)
def test_wrong_messages_are_not_counted_right(name):
    family, team = warm_team(warm_config_for(name))
    inst = family.generate(1, 3)[0]
    last = len(team.roles) - 1
    assert not team.message_ok(inst, last, "zz")
    assert family.verify(inst, "zz") == 0.0


@pytest.mark.parametrize("name", FAMILIES)
def test_demonstrations_render_through_the_rollout_prompt_path(tokenizer, name):
    family, team = warm_team(warm_config_for(name))
    for inst in family.generate(2, 17):
        examples = episode_examples(tokenizer, team, inst)
        transcript: list[tuple[str, str]] = []
        for k, (role, ex) in enumerate(zip(team.roles, examples, strict=True)):
            acting = with_private_view(role, family, inst, k)  # what EngineRunners hands the team graph
            assert ex.prompt_ids == render_prompt_ids(
                tokenizer, role_messages(acting, inst.prompt, transcript)
            )
            message = team.demonstration(inst, k)
            assert tokenizer.decode(ex.completion_ids) == message + MESSAGE_END
            transcript.append((role.name, message))


def test_split_roles_are_trained_on_their_own_table_only(tokenizer):
    family, team = warm_team(warm_config_for("split"))
    inst = family.generate(1, 4)[0]
    examples = episode_examples(tokenizer, team, inst)
    for k, ex in enumerate(examples):
        context = tokenizer.decode(ex.prompt_ids)
        for j in range(len(examples)):
            assert (family.role_view(inst, j) in context) == (j == k)


def test_team_evaluation_uses_the_family_verifier(tokenizer):
    family, team = warm_team(warm_config_for("autologi"))
    model = new_model(tokenizer, 64, 2, 2, seed=0)
    instances = family.generate(4, 1)
    result, rewards = evaluate_team(model, tokenizer, family, team, instances)
    assert result.episodes == 4 and len(rewards) == 4 and result.step_inputs[0] == 4
    assert result.team_accuracy == sum(rewards) / 4


def test_short_build_of_a_non_chain_family_is_loadable(tmp_path):
    cfg = tiny_family_config("split")
    report = build_warm_model(cfg, tmp_path / "m", progress=False)
    assert is_complete(tmp_path / "m")
    loaded = load_report(tmp_path / "m")
    assert loaded.config["task"] == "split" and loaded.greedy.episodes == cfg.final_eval_tasks
    assert len(loaded.greedy.step_accuracy) == cfg.steps and report.optimizer_steps >= 1
    AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    PreTrainedTokenizerFast.from_pretrained(tmp_path / "m")


def test_chain_demo_cache_key_is_pinned(monkeypatch):
    import teamtr.training.warmstart.config as config

    assert WarmStartConfig().cache_key() == CHAIN_DEMO_KEY
    # what the `teamtr warmstart` command passes is the same model
    assert warm_config_for("chain", threads=1, adapt_threads=False).cache_key() == CHAIN_DEMO_KEY
    # the thread count changes the weights (reductions add in another order): another model
    assert WarmStartConfig(threads=2).cache_key() != CHAIN_DEMO_KEY
    # a new build procedure invalidates every cached model
    monkeypatch.setattr(config, "WARMSTART_FORMAT", config.WARMSTART_FORMAT + 1)
    assert WarmStartConfig().cache_key() != CHAIN_DEMO_KEY
    monkeypatch.undo()
    assert warm_config_for("chain").cache_key() == CHAIN_DEMO_KEY
    assert WarmStartConfig(task="chain", task_options={}).cache_key() == CHAIN_DEMO_KEY
    keys = {warm_config_for(name).cache_key() for name in FAMILIES}
    assert len(keys) == len(FAMILIES) and CHAIN_DEMO_KEY not in keys
    split_key = warm_config_for("split").cache_key()
    assert warm_config_for("split", task_options={"size": 2}).cache_key() != split_key
    assert (
        warm_config_for("split", task_options=vars(get_task("split").defaults)).cache_key() == split_key
    )  # = defaults


def test_bigger_teams_get_a_bigger_step_budget_and_measured_sizes_keep_their_models():
    def budget(task: str, n: int, **extra) -> WarmStartConfig:
        options = {} if task == "chain" else {"task_options": {"steps": n}}
        return warm_config_for(task, steps=n, **options, **extra)

    # the sizes the fixed budget was measured on keep it, and so their cached models (cache keys)
    assert [budget("chain", n).max_steps for n in (2, 3, 4)] == [600] * 3
    assert [budget("convention", n).max_steps for n in (2, 3)] == [600] * 2
    assert budget("chain", 3).cache_key() == CHAIN_DEMO_KEY
    assert warm_config_for("convention").max_steps == 600
    # beyond them the budget grows with every role (convention at 4 roles ran out of 600 steps at 0%)
    conv = [budget("convention", n).max_steps for n in (4, 5, 6)]
    assert conv[0] > 600 and conv[0] < conv[1] < conv[2]
    assert conv[0] == 1300  # the model of the study's convention n = 4 cells (docs/study.md)
    assert 600 < budget("chain", 5).max_steps < budget("chain", 6).max_steps
    # an explicit budget wins; families without a scaled budget keep theirs at any size
    assert budget("convention", 6, max_steps=50).max_steps == 50
    assert warm_config_for("countdown", steps=6).max_steps == FAMILY_SETTINGS["countdown"]["max_steps"]


def test_config_rejects_unknown_tasks_and_chain_options():
    with pytest.raises(ValueError, match="unknown task"):
        WarmStartConfig(task="nope")
    with pytest.raises(ValueError, match="task_options"):
        WarmStartConfig(task_options={"steps": 2})
    with pytest.raises(ValueError, match="housez"):
        WarmStartConfig(task="zebra", task_options={"housez": 2})


@pytest.fixture
def cached_split_model(tmp_path, monkeypatch):
    """A tiny completed build stored where split's default warm model is cached (no real build)."""
    monkeypatch.setenv("TEAMTR_CACHE", str(tmp_path))
    cfg = warm_config_for("split")
    path = tmp_path / "models" / f"split-warm-{cfg.cache_key()}"
    build_warm_model(tiny_family_config("split", max_steps=1), path, progress=False)
    assert is_complete(path)
    return path


def test_eval_warm_resolves_the_family_model(cached_split_model, tmp_path):
    from teamtr.cli.main import app

    team = load_eval_team("warm", "split")
    assert team.bases == {"base": str(cached_split_model)}
    args = ["eval", "warm", "--task", "split", "--limit", "2", "--json", "--out", str(tmp_path / "e")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert '"task": "split"' in result.stdout


def test_trainer_starts_a_family_from_its_warm_model(cached_split_model):
    from teamtr.training.config import TaskConfig, TrainConfig
    from teamtr.training.trainer import Trainer

    cfg = TrainConfig(task=TaskConfig(name="split"))
    assert Trainer(cfg).model_path() == str(cached_split_model)


def test_warmstart_command_reuses_the_cached_family_model(cached_split_model):
    import json

    from teamtr.cli.main import app

    result = CliRunner().invoke(app, ["warmstart", "--task", "split", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["path"] == str(cached_split_model) and report["config"]["task"] == "split"
    bad = CliRunner().invoke(app, ["warmstart", "--task", "nope"])
    assert bad.exit_code != 0 and "unknown task" in bad.output
