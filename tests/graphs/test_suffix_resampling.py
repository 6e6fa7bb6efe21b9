"""Suffix resampling on an LLM team (graphs/team.py `Team.arun_from`): after role 2's adapter changes,
episodes of the old team re-run from role 2's turn are distributed as episodes of the new team sampled
in full (two-sample chi-square tests on the messages' token ids), while keeping the stale episodes is
detectably different. The exact-lab counterpart is tests/theory/test_suffix.py."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Literal

import pytest
import torch
from scipy.stats import chi2_contingency

from teamtr.engines.embedded import EmbeddedEngine
from teamtr.engines.random_adapters import randomise_adapters
from teamtr.graphs.chain_team import chain_team
from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.team import derive_seed
from teamtr.graphs.trajectory import Trajectory
from teamtr.tasks import get_task

ROLES = ("adder1", "adder2", "adder3")
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=2, stop=("\n",))
EPISODES = 300


@pytest.fixture(scope="module")
def peaked_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """The tests' random tiny model with its output layer scaled up: a random init's next-token
    distribution is near uniform whatever the context (small logits), so no adapter could move it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.support.tiny_model import build_tiny_model

    src = build_tiny_model(tmp_path_factory.mktemp("tiny-src"))
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(12.0)
    out = tmp_path_factory.mktemp("tiny-peaked")
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return out


@pytest.fixture
def engine(peaked_model_dir):
    eng = EmbeddedEngine(peaked_model_dir, adapters={r: None for r in ROLES}, threads=1)
    randomise_adapters(eng, ROLES, std=0.3, seed=1)
    return eng


def _change_adapter(engine: EmbeddedEngine, role: str, scale: float) -> None:
    """A large update of `role`'s adapter (a new version)."""
    torch.manual_seed(7)
    with torch.no_grad():
        for p in engine.adapter_parameters(role).values():
            p.normal_(0, scale)
    engine.commit_adapter_update(role)


def _messages(trajs: list[Trajectory], role: str) -> list[tuple[int, ...]]:
    """Each of `role`'s messages as its token ids (a categorical sample)."""
    return [tuple(t.completion_ids) for traj in trajs for t in traj.turns_of(role)]


def _p_value(a: list[tuple[int, ...]], b: list[tuple[int, ...]], min_count: int = 10) -> float:
    """Chi-square two-sample test on categorical samples (rare categories pooled into one)."""
    counts = Counter(a) + Counter(b)
    common = sorted(c for c, n in counts.items() if n >= min_count)

    def row(xs: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        c = Counter(x if x in common else -1 for x in xs)
        return [c[k] for k in [*common, -1]]

    table = [row(a), row(b)]
    keep = [k for k in range(len(table[0])) if table[0][k] + table[1][k] > 0]
    return float(chi2_contingency([[r[k] for k in keep] for r in table])[1])


def _suffix(team, tasks, old: list[Trajectory], cut: int, seed: int) -> list[Trajectory]:
    by_id = {t.id: t for t in tasks}

    async def all_episodes() -> list[Trajectory]:
        return list(
            await asyncio.gather(
                *(
                    team.arun_from(by_id[tr.task_id], tr.turns[:cut], seed=derive_seed(seed, n))
                    for n, tr in enumerate(old)
                )
            )
        )

    return asyncio.run(all_episodes())


def test_suffix_resampling_matches_full_resampling_and_the_stale_suffix_does_not(engine):
    task = get_task("chain")
    team = chain_team(engine, sampling=SAMPLING)
    tasks = task.generate(EPISODES // 10, seed=0)
    old = team.run(tasks, group_size=10, seed=1)
    stale_role2 = _messages(old, "adder2")

    _change_adapter(engine, "adder2", scale=1.0)
    full = team.run(tasks, group_size=10, seed=2)
    suffix = _suffix(team, tasks, old, cut=1, seed=3)

    for traj, before in zip(suffix, old, strict=True):  # the kept prefix is the old turn, as it was
        assert traj.turns[0] is before.turns[0]
        assert [t.role for t in traj.turns] == list(ROLES)
        assert traj.turns[1].adapter_version == engine.adapter_version("adder2")
    for role in ("adder2", "adder3"):
        p = _p_value(_messages(suffix, role), _messages(full, role))
        assert p > 0.01, (role, p)
    # negative control: the stale episodes (not resampled from role 2 on) are told apart from the new team
    assert _p_value(stale_role2, _messages(full, "adder2")) < 1e-4


def test_restarting_from_a_prefix_continues_the_transcript(engine):
    """The restarted graph sees the kept messages: role 3's prompt in the resampled episode is the task
    plus the kept message and the new one (the same context a full episode would have built)."""
    task = get_task("chain")
    team = chain_team(engine, sampling=SAMPLING)
    tasks = task.generate(1, seed=4)
    old = team.run(tasks, seed=5)[0]
    new = _suffix(team, tasks, [old], cut=2, seed=6)[0]
    tok = engine.tokenizer()
    assert new.turns[:2] == old.turns[:2]
    context = tok.decode(new.turns[2].prompt_ids)
    assert tok.decode(old.turns[2].prompt_ids) == context  # same prefix -> same context for role 3
    assert new.metadata["prefix_turns"] == 2


def test_trainer_with_suffix_resampling_keeps_the_prefix_before_the_updated_role(tmp_path):
    """`schedule.resample: suffix` in a real run: after adder1's update nothing is kept (it speaks
    first), after adder2's every episode keeps adder1's turn; only new tokens count as train_tokens."""
    from teamtr.graphs.run_layout import read_metrics
    from teamtr.training.warmstart import tiny_random_model
    from tests.support.trainer import small_config, train

    model = str(tiny_random_model(tmp_path / "model"))
    cfg = small_config(model, tmp_path / "suffix", **{"schedule.resample": "suffix"})
    updates = train(cfg)
    # the reference run resamples in full (suffix is the default)
    full = train(small_config(model, tmp_path / "full", **{"schedule.resample": "full"}))
    resamples = read_metrics(cfg.run_dir, kind="resample")
    assert [r["mode"] for r in resamples] == ["suffix", "suffix"]
    assert [r["updated"] for r in resamples] == [["adder1"], ["adder2"]]
    episodes = cfg.rollout.prompts_per_update * cfg.rollout.group_size
    assert resamples[0]["turns_kept"] == 0
    assert resamples[1]["turns_kept"] == episodes - resamples[1]["episodes_kept_whole"]
    for prev, cur in zip(updates, updates[1:], strict=False):  # the resampled turns carry the new version
        assert cur["batch_turn_versions"][prev["adapter"]] == [prev["version_after"]]
    assert updates[-1]["train_tokens"] < full[-1]["train_tokens"]


def reversed_chain(state) -> Literal["adder3", "adder2", "adder1", "__end__"]:
    """A custom router (adder3, adder2, adder1): the team cannot restart from a prefix."""
    k = len(state["transcript"])
    return ["adder3", "adder2", "adder1"][k] if k < 3 else "__end__"


def test_a_custom_router_falls_back_to_full_resampling_and_says_so(tmp_path):
    from teamtr.graphs.run_layout import read_metrics
    from teamtr.training.warmstart import tiny_random_model
    from tests.support.trainer import small_config, train

    model = str(tiny_random_model(tmp_path / "model"))
    overrides = {"schedule.resample": "suffix", "team.router": f"{__name__}:reversed_chain"}
    cfg = small_config(model, tmp_path / "run", **overrides)
    updates = train(cfg)
    resamples = read_metrics(cfg.run_dir, kind="resample")
    assert [r["mode"] for r in resamples] == ["full", "full"]
    assert all("custom router" in r["reason"] for r in resamples)
    assert len(updates) == 3 and all(u["fresh"] for u in updates)
