"""The warm-started demo model: formatting without drift, save/load fidelity, learning, decoding as the
engine decodes, bitwise-deterministic builds, and the cache."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from teamtr.graphs.chat_format import render_prompt_ids
from teamtr.graphs.roles import role_messages
from teamtr.tasks import get_task
from teamtr.training.tiny_models import MESSAGE_END, build_char_tokenizer
from teamtr.training.warmstart import (
    IGNORE_INDEX,
    REPORT_FILE,
    WarmStartConfig,
    build_warm_model,
    chain_roles,
    collate,
    completion_loss,
    ensure_warm_model,
    episode_examples,
    evaluate_team,
    is_complete,
    load_report,
    new_model,
    pack_episode,
    save_model,
    tiny_random_model,
    training_batches,
)
from tests.support.warmstart import tiny_config

torch.set_num_threads(int(os.environ.get("TEAMTR_TORCH_THREADS", "1")))


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def task():
    return get_task("chain")


def test_sft_prompts_are_the_rollout_rendering(tokenizer, task):
    roles = chain_roles(3)
    for inst in task.generate(5, seed=11):
        ops = inst.meta["operands"]
        examples = episode_examples(tokenizer, roles, inst)
        assert [ex.role for ex in examples] == ["adder1", "adder2", "adder3"]
        transcript: list[tuple[str, str]] = []
        for step, (role, ex) in enumerate(zip(roles, examples, strict=True), start=1):
            # the context exactly as a rollout renders it, on the correct transcript so far
            assert ex.prompt_ids == render_prompt_ids(tokenizer, role_messages(role, inst.prompt, transcript))
            message = task.demonstration(ops, step)
            assert tokenizer.decode(ex.completion_ids) == message + MESSAGE_END
            transcript.append((role.name, message))
        assert task.verify(inst, transcript[-1][1]) == 1.0


def test_packed_episode_trains_exactly_the_step_examples(tokenizer, task):
    inst = task.generate(1, seed=3)[0]
    examples = episode_examples(tokenizer, chain_roles(3), inst)
    [(ids, labels)] = pack_episode(examples)  # the template chains: one sequence per episode
    assert len(ids) == len(labels)
    # each step's context is a prefix of the sequence, followed by its completion, which is supervised
    for ex in examples:
        n = len(ex.prompt_ids)
        assert ids[:n] == ex.prompt_ids
        assert ids[n : n + len(ex.completion_ids)] == ex.completion_ids
        assert labels[n : n + len(ex.completion_ids)] == ex.completion_ids
    supervised = sum(lab != IGNORE_INDEX for lab in labels)
    assert supervised == sum(len(ex.completion_ids) for ex in examples)


def test_pack_keeps_steps_apart_when_contexts_do_not_chain(tokenizer, task):
    inst = task.generate(1, seed=4)[0]
    examples = episode_examples(tokenizer, chain_roles(2), inst)
    examples[1].prompt_ids = [tokenizer.bos_token_id] + examples[1].prompt_ids  # breaks the prefix
    seqs = pack_episode(examples)
    assert len(seqs) == 2
    assert seqs[1][0] == examples[1].prompt_ids + examples[1].completion_ids


def test_saved_model_and_tokenizer_reload_identically(tmp_path, tokenizer, task):
    model = new_model(tokenizer, hidden=64, layers=2, heads=2, seed=5).eval()
    save_model(model, tokenizer, tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    loaded_tok = PreTrainedTokenizerFast.from_pretrained(tmp_path)
    assert type(loaded).__name__ == "LlamaForCausalLM"
    assert loaded.config.hidden_size // loaded.config.num_attention_heads == 32  # vLLM's head sizes
    assert loaded_tok.padding_side == "left"
    inst = task.generate(1, seed=0)[0]
    msgs = role_messages(chain_roles(1)[0], inst.prompt, [])
    ids = render_prompt_ids(loaded_tok, msgs)
    assert ids == render_prompt_ids(tokenizer, msgs)  # chat template and vocabulary survive saving
    with torch.no_grad():
        x = torch.tensor([ids])
        assert torch.equal(model(x).logits, loaded(x).logits)


def test_tiny_random_model_loads(tmp_path):
    path = tiny_random_model(tmp_path / "tiny")
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = PreTrainedTokenizerFast.from_pretrained(path)
    assert model.config.num_hidden_layers == 2 and model.config.vocab_size == len(tok)


def test_supervised_loss_decreases(tokenizer, task):
    torch.manual_seed(0)
    cfg = tiny_config(batch_size=16)
    model = new_model(tokenizer, cfg.hidden, cfg.layers, cfg.heads, seed=0)
    batches = training_batches(tokenizer, task, chain_roles(cfg.steps), cfg)
    held_out = collate(
        [
            s
            for inst in task.generate(16, seed=99)
            for s in pack_episode(episode_examples(tokenizer, chain_roles(3), inst))
        ],
        tokenizer.pad_token_id,
    )
    with torch.no_grad():
        before = completion_loss(model, held_out).item()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(30):
        loss = completion_loss(model, next(batches))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        after = completion_loss(model, held_out).item()
    assert after < 0.8 * before


def test_shared_prefix_loss_equals_the_plain_loss(tokenizer, task):
    cfg = tiny_config(batch_size=6)
    model = new_model(tokenizer, cfg.hidden, cfg.layers, cfg.heads, seed=2)
    batch = next(training_batches(tokenizer, task, chain_roles(cfg.steps), cfg))
    grads = []
    for share in (False, True):
        model.zero_grad()
        loss = completion_loss(model, batch, share_prefix=share)
        loss.backward()
        grads.append((loss.item(), [p.grad.clone() for p in model.parameters()]))
    (plain, g_plain), (shared, g_shared) = grads
    assert shared == pytest.approx(plain, rel=1e-5)
    for a, b in zip(g_plain, g_shared, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_team_evaluation_bookkeeping(tokenizer, task):
    model = new_model(tokenizer, 64, 2, 2, seed=1)
    instances = task.generate(6, seed=2)
    team, rewards = evaluate_team(model, tokenizer, task, chain_roles(3), instances)
    assert team.episodes == 6 and len(rewards) == 6
    assert team.step_inputs[0] == 6  # role 1 always acts on a correct context
    assert all(a >= b for a, b in zip(team.step_inputs, team.step_inputs[1:], strict=False))
    assert 0.0 <= team.team_accuracy <= 1.0 and team.team_accuracy == sum(rewards) / 6


def test_builder_decoding_matches_the_embedded_engine(tmp_path, tokenizer, task):
    """The builder decodes its in-memory model with `model.generate`; greedy, that must write exactly
    what the embedded engine (which the demo, eval and training use) writes, or the accuracy a build
    stops on would not be the accuracy the demo reports."""
    import asyncio

    from teamtr.engines.embedded import EmbeddedEngine
    from teamtr.graphs.engine import SamplingParams
    from teamtr.training.warmstart.evaluate import generate_messages

    # a few dozen steps: it writes digits and ends its messages (an untrained model writes only specials)
    cfg = tiny_config(max_steps=40, eval_every=40, lr=5e-3, warmup_steps=5)
    path = tmp_path / "m"
    build_warm_model(cfg, path, progress=False)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    first, second = chain_roles(2)
    prompts = [  # of different lengths, so the batch is left-padded
        render_prompt_ids(tokenizer, role_messages(role, inst.prompt, transcript))
        for inst in task.generate(4, seed=8)
        for role, transcript in ((first, []), (second, [("adder1", "12+9+5")]))
    ]
    ours = generate_messages(model, tokenizer, prompts, temperature=0.0, max_new_tokens=12)
    engine = EmbeddedEngine(path, threads=1)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12, stop=(MESSAGE_END,))

    async def decode_all():
        return await asyncio.gather(*(engine.generate(p, adapter=None, sampling=greedy) for p in prompts))

    theirs = [g.text.split(MESSAGE_END, 1)[0] for g in asyncio.run(decode_all())]
    assert ours == theirs and any(ours)


def test_build_writes_a_complete_loadable_model(tmp_path):
    cfg = tiny_config()
    report = build_warm_model(cfg, tmp_path / "m", progress=False)
    assert is_complete(tmp_path / "m")
    assert report.optimizer_steps >= 1 and report.history
    assert load_report(tmp_path / "m").greedy.episodes == cfg.final_eval_tasks
    lines = (tmp_path / "m" / "warmstart_history.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [r["step"] for r in report.history]
    AutoModelForCausalLM.from_pretrained(tmp_path / "m")


def test_build_is_bitwise_deterministic_whatever_the_callers_thread_count(tmp_path):
    """The build runs with its config's thread count and deterministic kernels, so the weights are
    bitwise equal whatever torch's thread count was when it was called. (4 threads is there because on
    this machine's CPU a build that used 4 threads gives other weights than one that used 1: without the
    pinning this test fails.) The caller's settings and random state are restored afterwards."""
    cfg = tiny_config(max_steps=6, eval_every=2, batch_size=4)
    before = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())
    digests, histories = [], []
    try:
        for ambient in (1, 2, 4):
            torch.set_num_threads(ambient)
            torch.manual_seed(123)
            report = build_warm_model(cfg, tmp_path / f"threads{ambient}", progress=False)
            assert torch.get_num_threads() == ambient and not torch.are_deterministic_algorithms_enabled()
            assert torch.equal(torch.rand(3), torch.rand(3, generator=torch.Generator().manual_seed(123)))
            assert report.threads == cfg.threads == 1
            digests.append(report.files["model.safetensors"])
            histories.append([(r["step"], r["loss"], r["team_accuracy"]) for r in report.history])
    finally:
        torch.set_num_threads(before[0])
        torch.use_deterministic_algorithms(before[1])
    assert digests[0] == digests[1] == digests[2]
    assert histories[0] == histories[1] == histories[2] and len(histories[0]) == 3


def test_cache_reuses_and_rebuilds(tmp_path, monkeypatch):
    monkeypatch.setenv("TEAMTR_CACHE", str(tmp_path))
    cfg = tiny_config()
    path = ensure_warm_model(cfg, progress=False)
    assert path.parent.parent == tmp_path and is_complete(path)
    stamp = (path.stat().st_ino, (path / REPORT_FILE).stat().st_mtime_ns)

    # second call: same folder, not rebuilt
    assert ensure_warm_model(cfg, progress=False) == path
    assert (path.stat().st_ino, (path / REPORT_FILE).stat().st_mtime_ns) == stamp

    # another config: another folder
    other = ensure_warm_model(tiny_config(seed=1), progress=False)
    assert other != path

    # corrupt weights: detected and rebuilt
    weights = next(path.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])
    assert not is_complete(path)
    assert ensure_warm_model(cfg, progress=False) == path
    assert is_complete(path)
    AutoModelForCausalLM.from_pretrained(path)

    # partial build (no report): rebuilt
    (path / REPORT_FILE).unlink()
    assert ensure_warm_model(cfg, progress=False) == path and is_complete(path)
    leftovers = [p.name for p in tmp_path.joinpath("models").iterdir() if p.name.startswith(".")]
    assert leftovers == []  # no temporary folders left behind


def test_concurrent_builds_end_with_one_complete_model(tmp_path, monkeypatch):
    monkeypatch.setenv("TEAMTR_CACHE", str(tmp_path))
    cfg = tiny_config(max_steps=1)
    paths: list[Path] = []
    errors: list[BaseException] = []

    def build() -> None:
        try:
            paths.append(ensure_warm_model(cfg, progress=False))
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(paths)) == 1 and is_complete(paths[0])


def test_a_run_config_builds_its_warm_model_with_team_warm_start(tmp_path, monkeypatch):
    """`team.warm_start` (with `team.model: null`) decides the warm model a run and the demo use: the
    model built from the task's warm-start settings with those overrides, the demo's warm seed on top."""
    from teamtr.training.config import TrainConfig
    from teamtr.training.demo import demo_model
    from teamtr.training.run_dir import model_path
    from teamtr.training.warmstart import warm_config_for

    monkeypatch.setenv("TEAMTR_CACHE", str(tmp_path))
    overrides = changed_fields(tiny_config(max_steps=2))
    cfg = TrainConfig.from_dict({"team": {"warm_start": overrides}})
    path = Path(model_path(cfg))
    assert path == ensure_warm_model(warm_config_for("chain", **overrides), progress=False)
    assert json.loads((path / REPORT_FILE).read_text())["config"]["max_steps"] == 2
    assert Path(demo_model(cfg)) == path  # no warm seed given: the config's own model
    seeded = Path(demo_model(cfg, warm_seed=1))
    assert seeded != path and seeded == ensure_warm_model(
        warm_config_for("chain", **{**overrides, "seed": 1}), progress=False
    )
    assert Path(model_path(TrainConfig.from_dict({"team": {"warm_start": overrides, "model": str(path)}}))) == path
    with pytest.raises(ValueError, match="unknown WarmStartConfig fields \\['stop_acuracy'\\]"):
        TrainConfig.from_dict({"team": {"warm_start": {"stop_acuracy": 0.4}}})


def changed_fields(cfg: WarmStartConfig) -> dict:
    """The fields a config sets away from WarmStartConfig's defaults."""
    default = WarmStartConfig()
    return {k: getattr(cfg, k) for k in cfg.__dataclass_fields__ if getattr(cfg, k) != getattr(default, k)}


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="divisible"):
        WarmStartConfig(hidden=100, heads=3)
    with pytest.raises(ValueError, match="band"):
        WarmStartConfig(stop_accuracy=0.9)
    with pytest.raises(ValueError, match="batch_size"):
        WarmStartConfig(batch_size=0)
