"""vLLM's recorded log-probs are those of the distribution each token was sampled from, as the embedded
engine's (graphs/engine.py SamplingParams): the server runs with `--logprobs-mode processed_logprobs`
(temperature and top-p applied, renormalised over the nucleus); greedy requests keep the T = 1 ones.
Checked against transformers, one unpadded forward per prefix (tests/engines/test_behaviour_logprobs.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from teamtr.engines.vllm_engine import VLLMEngine
from teamtr.graphs.engine import SamplingParams
from tests.support.logprobs import expected_logprobs

pytestmark = pytest.mark.vllm

torch.set_num_threads(1)
TOLERANCE = 1e-3  # vLLM (float32) vs transformers log-probs of the same tokens


@pytest.fixture(scope="module")
def base_model(vllm_model_dir: Path):
    return AutoModelForCausalLM.from_pretrained(str(vllm_model_dir), dtype=torch.float32).eval()


@pytest.mark.parametrize(("temperature", "top_p"), [(0.7, 1.0), (0.7, 0.9), (0.0, 1.0)])
async def test_vllm_records_the_logprobs_of_the_sampling_distribution(
    vllm_engine: VLLMEngine, base_model, temperature: float, top_p: float
) -> None:
    ids = vllm_engine.tokenizer()("7+8+9=")["input_ids"]
    sampling = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=16, seed=3)
    gen = await vllm_engine.generate(ids, adapter=None, sampling=sampling)
    assert (gen.temperature, gen.top_p) == (temperature, top_p)
    exact = expected_logprobs(base_model, ids, gen.completion_ids, temperature, top_p)
    assert max(abs(a - b) for a, b in zip(gen.logprobs, exact, strict=True)) < TOLERANCE
    if temperature > 0:  # and they are not the untempered ones
        at_t1 = expected_logprobs(base_model, ids, gen.completion_ids, 1.0)
        assert max(abs(a - b) for a, b in zip(gen.logprobs, at_t1, strict=True)) > 10 * TOLERANCE
