"""Adapter registry: validation refuses bad adapters (the old version keeps serving), episodes finish on the
versions they pinned while new ones are promoted, rollback, and the admin API / CLI around it."""

from __future__ import annotations

import asyncio
import json
import shutil

import httpx
import pytest
import torch
from langchain_core.callbacks import AsyncCallbackHandler
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from teamtr.cli.serve import app as cli_app
from teamtr.engines.embedded import EmbeddedEngine
from teamtr.graphs.chain_team import chain_roles
from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.run_layout import version_dirs
from teamtr.graphs.team import Team
from teamtr.serving.adapter_checks import AdapterError, inspect_adapter
from teamtr.serving.registry import AdapterRegistry
from teamtr.serving.server import ServeConfig
from teamtr.tasks import get_task
from tests.support.serving import ROLES, adapter_config, make_run_dir, serve_in_background, write_versions

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8, stop=("\n",))


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir, tmp_path_factory):
    return make_run_dir(tiny_model_dir, tmp_path_factory.mktemp("run"), versions=3)


@pytest.fixture
def engine(tiny_model_dir):
    return EmbeddedEngine(tiny_model_dir, threads=1)


def _broken_copy(src, dst, mutate):
    shutil.copytree(src, dst)
    mutate(dst)
    return dst


def _mutations(tmp_path, tiny_model_dir):
    other_rank = write_versions(tiny_model_dir, tmp_path / "r8", range(1, 2), roles=("adder1",), rank=8)
    other_targets = write_versions(
        tiny_model_dir, tmp_path / "tm", range(1, 2), roles=("adder1",), target_modules=("q_proj", "k_proj")
    )

    def pickle_file(d):
        (d / "adapter_model.bin").write_bytes(b"\x80\x04pickle")

    def truncated(d):
        data = (d / "adapter_model.safetensors").read_bytes()
        (d / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])

    def garbage(d):
        (d / "adapter_model.safetensors").write_bytes(b"not a safetensors file at all" * 10)

    def nan(d):
        tensors = load_file(d / "adapter_model.safetensors")
        key = next(k for k in tensors if "lora_B" in k)
        tensors[key][0, 0] = float("nan")
        save_file(tensors, d / "adapter_model.safetensors")

    def wrong_shape(d):
        tensors = load_file(d / "adapter_model.safetensors")
        key = next(k for k in tensors if "lora_B" in k)
        tensors[key] = torch.zeros(tensors[key].shape[0] * 2, tensors[key].shape[1])
        save_file(tensors, d / "adapter_model.safetensors")

    def other_base(d):
        cfg = adapter_config(d)
        cfg["base_model_name_or_path"] = "Qwen/Qwen3-8B"
        (d / "adapter_config.json").write_text(json.dumps(cfg))

    def not_lora(d):
        cfg = adapter_config(d)
        cfg["peft_type"] = "PREFIX_TUNING"
        (d / "adapter_config.json").write_text(json.dumps(cfg))

    def no_weights(d):
        (d / "adapter_model.safetensors").unlink()

    def bad_json(d):
        (d / "adapter_config.json").write_text("{not json")

    return {
        "pickle": (pickle_file, "pickle"),
        "truncated": (truncated, "safetensors"),
        "garbage": (garbage, "safetensors"),
        "nan": (nan, "NaN"),
        "wrong_shape": (wrong_shape, "shape"),
        "other_base": (other_base, "base model"),
        "not_lora": (not_lora, "LoRA"),
        "no_weights": (no_weights, "missing adapter_model.safetensors"),
        "bad_json": (bad_json, "JSON"),
        "rank": (other_rank / "adapters" / "adder1" / "v1", "rank"),
        "targets": (other_targets / "adapters" / "adder1" / "v1", "target modules"),
    }


async def test_bad_adapters_are_refused_and_the_old_version_keeps_serving(
    engine, run_dir, tmp_path, tiny_model_dir
):
    registry = AdapterRegistry(engine)
    v1 = version_dirs(run_dir, "adder1")[0][1]
    await registry.push("adder1", v1)
    prompt = engine.tokenizer()("12+7\n")["input_ids"]
    before = (await engine.generate(prompt, adapter="adder1@v1", sampling=GREEDY)).completion_ids
    for name, (mutation, reason) in _mutations(tmp_path, tiny_model_dir).items():
        path = mutation if not callable(mutation) else _broken_copy(v1, tmp_path / name / "v9", mutation)
        with pytest.raises(AdapterError, match=reason):
            await registry.push("adder1", path)
        assert registry.current("adder1").version == 1, name
        assert engine.adapters() == ["adder1@v1"], name
    after = (await engine.generate(prompt, adapter="adder1@v1", sampling=GREEDY)).completion_ids
    assert after == before


def test_a_valid_adapter_passes_inspection(run_dir):
    sig = inspect_adapter(version_dirs(run_dir, "adder2")[-1][1])
    assert sig.rank == 4 and sig.target_modules == ("q_proj", "v_proj")
    assert all(("lora_A" in k and s[0] == 4) or ("lora_B" in k and s[1] == 4) for k, s in sig.shapes)


async def test_in_flight_episode_finishes_on_its_pinned_versions(engine, run_dir):
    """A new version goes live between two turns of a running episode: that episode keeps sampling from
    the versions it pinned (log-probs rescored under those exact weights), new episodes get the new one."""
    registry = AdapterRegistry(engine)
    for role in ROLES:
        await registry.push(role, version_dirs(run_dir, role)[0][1])  # v1
    roles = chain_roles(sampling=GREEDY)
    team = Team.from_engine(roles, engine, name="chain")
    first_turn_done, swapped = asyncio.Event(), asyncio.Event()

    class HoldBeforeSecondTurn(AsyncCallbackHandler):  # adder1 has spoken, adder2 is about to
        run_inline = True

        async def on_chat_model_start(self, serialized, messages, *, metadata=None, **kwargs):
            if (metadata or {}).get("langgraph_node") == "adder2":
                first_turn_done.set()
                await swapped.wait()

    async def promote():
        await first_turn_done.wait()
        for role in ROLES:
            await registry.push(role, version_dirs(run_dir, role)[1][1])  # v2
        swapped.set()

    task = get_task("chain").generate(1, seed=0)[0]
    async with registry.pin([*ROLES]) as pins:
        pinned = {role: pins[role] for role in ROLES}
        trajectory, _ = await asyncio.gather(
            team.arun(task, adapter_pins=pinned, config={"callbacks": [HoldBeforeSecondTurn()]}), promote()
        )
        assert registry.current_versions() == {r: 2 for r in ROLES}
        assert set(engine.adapters()) == {f"{r}@v{v}" for r in ROLES for v in (1, 2)}  # v1 still pinned
        for turn in trajectory.turns:
            assert turn.adapter_version == 1
            old = engine.score([turn.prompt_ids], [turn.completion_ids], f"{turn.adapter}@v1")[0]
            new = engine.score([turn.prompt_ids], [turn.completion_ids], f"{turn.adapter}@v2")[0]
            assert old == pytest.approx(turn.logprobs, abs=1e-4)
            assert new != pytest.approx(turn.logprobs, abs=1e-4)
    assert set(engine.adapters()) == {f"{r}@v2" for r in ROLES}  # unloaded once no episode uses v1
    async with registry.pin([*ROLES]) as pins:
        fresh = await team.arun(task, adapter_pins={r: pins[r] for r in ROLES})
    assert all(t.adapter_version == 2 for t in fresh.turns)


async def test_rollback_serves_the_previous_version_again(engine, run_dir):
    registry = AdapterRegistry(engine)
    for _, path in version_dirs(run_dir, "adder3"):
        await registry.push("adder3", path)
    assert registry.current("adder3").version == 3 and engine.adapters() == ["adder3@v3"]
    back = await registry.rollback("adder3")
    assert back.version == 2 and registry.current("adder3").version == 2
    assert engine.adapters() == ["adder3@v2"]  # reloaded from its directory, v3 unloaded
    assert (await registry.rollback("adder3")).version == 1
    with pytest.raises(AdapterError, match="no previous version"):
        await registry.rollback("adder3")
    with pytest.raises(AdapterError, match="already registered"):
        await registry.push("adder3", version_dirs(run_dir, "adder3")[0][1])


def test_admin_api_and_cli_push_list_rollback(tiny_model_dir, tmp_path):
    run = make_run_dir(tiny_model_dir, tmp_path / "run", versions=1)
    config = ServeConfig.from_run_dir(run, "chain", admin_key="adm", tracing={"sqlite_path": None})
    runner = CliRunner()
    with serve_in_background(config) as server:
        env = {"TEAMTR_URL": server.url, "TEAMTR_ADMIN_KEY": "adm"}
        write_versions(tiny_model_dir, run, range(2, 3))
        result = runner.invoke(cli_app, ["adapters", "push", str(run), "--role", "adder2"], env=env)
        assert result.exit_code == 0, result.output
        assert server.server.registry.current_versions()["adder2"] == 2
        health = httpx.get(server.url + "/health").json()
        assert health["adapters"] == {"adder1": 1, "adder2": 2, "adder3": 1}

        bad = tmp_path / "bad" / "v7"
        shutil.copytree(run / "adapters" / "adder2" / "v2", bad)
        (bad / "adapter_model.pt").write_bytes(b"pickle")
        result = runner.invoke(cli_app, ["adapters", "push", str(bad), "--role", "adder2"], env=env)
        assert result.exit_code == 1 and "pickle" in result.output
        assert server.server.registry.current_versions()["adder2"] == 2

        result = runner.invoke(cli_app, ["adapters", "list"], env=env)
        assert result.exit_code == 0 and "adder2" in result.output
        listed = httpx.get(server.url + "/admin/adapters", headers={"Authorization": "Bearer adm"}).json()
        assert listed["current"] == {"adder1": 1, "adder2": 2, "adder3": 1}
        assert [v["current"] for v in listed["roles"]["adder2"]] == [False, True]

        result = runner.invoke(cli_app, ["adapters", "rollback", "--role", "adder2"], env=env)
        assert result.exit_code == 0, result.output
        assert server.server.registry.current_versions()["adder2"] == 1

        r = httpx.post(
            server.url + "/admin/adapters",
            json={"role": "ghost", "path": str(bad)},
            headers={"Authorization": "Bearer adm"},
        )
        assert r.status_code == 404 and r.json()["error"]["code"] == "adapter_not_found"
        result = runner.invoke(cli_app, ["adapters", "list"], env={**env, "TEAMTR_ADMIN_KEY": "wrong"})
        assert result.exit_code == 1 and "401" in result.output


def test_admin_client_returns_typed_answers_and_raises_on_errors(tiny_model_dir, tmp_path):
    from teamtr.client.admin_client import AdminClient, AdminRequestError, ServerUnreachableError
    from teamtr.client.admin_protocol import AdapterListResponse, AdapterVersionInfo

    run = make_run_dir(tiny_model_dir, tmp_path / "run", versions=1)
    config = ServeConfig.from_run_dir(run, "chain", admin_key="adm", tracing={"sqlite_path": None})
    with serve_in_background(config) as server:
        client = AdminClient(server.url + "/", "adm")
        write_versions(tiny_model_dir, run, range(2, 3))
        pushed = client.push("adder3", run / "adapters" / "adder3" / "v2")
        assert isinstance(pushed, AdapterVersionInfo)
        assert (pushed.role, pushed.version, pushed.current, pushed.engine_name) == (
            "adder3",
            2,
            True,
            "adder3@v2",
        )
        listed = client.list_versions()
        assert isinstance(listed, AdapterListResponse)
        assert listed.current == {"adder1": 1, "adder2": 1, "adder3": 2}
        assert client.rollback("adder3").version == 1
        assert server.server.registry.current_versions()["adder3"] == 1
        with pytest.raises(AdminRequestError) as refused:
            client.rollback("adder3")
        assert refused.value.status == 409 and "no previous version" in refused.value.message
        with pytest.raises(AdminRequestError) as wrong_key:
            AdminClient(server.url, "wrong").list_versions()
        assert wrong_key.value.status == 401 and wrong_key.value.message == "incorrect admin key"
        url = server.url
    with pytest.raises(ServerUnreachableError, match="cannot reach"):
        AdminClient(url, "adm", timeout_s=5).list_versions()
