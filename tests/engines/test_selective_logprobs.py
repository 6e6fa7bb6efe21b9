"""The selective log-softmax (engines/embedded_scoring.py) and the chunked exact KL
(training/vocab_kl.py): log-probs at completion positions only, the LM head a chunk of positions at a time
under checkpointing, equal to the old pass (float32 logits at every position + log_softmax) within 1e-5,
with and without a gradient, gradients included, per-row adapter mixing and body checkpointing included;
the exact KL equals a brute-force sum over the vocabulary; the trainer's passes split by a token budget.
"""

from __future__ import annotations

import pytest
import torch

from teamtr.engines.embedded import EmbeddedEngine, LoraSettings
from teamtr.engines.embedded_adapters import adapters_for
from teamtr.engines.embedded_scoring import body_checkpointing, enable_body_checkpointing
from teamtr.engines.random_adapters import ALL_LINEAR, randomise_adapters
from teamtr.training.policy import AdapterPolicy, budget_chunks
from teamtr.training.rollouts import RoleMessages, pad
from teamtr.training.vocab_kl import Side, full_logprobs, message_divergences, message_kl
from tests.support.tiny_model import build_tiny_model

ADAPTERS = ("r1", "r2")
PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14]]
COMPLETIONS = [[20, 21, 22, 23], [30, 31, 32, 33, 34, 35, 36], [40]]


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> EmbeddedEngine:
    path = build_tiny_model(tmp_path_factory.mktemp("selective"), hidden=64, layers=2, heads=2)
    eng = EmbeddedEngine(path, adapters=dict.fromkeys(ADAPTERS), lora=LoraSettings(target_modules=ALL_LINEAR))
    randomise_adapters(eng, ADAPTERS, std=0.1, seed=0)
    return eng


def old_token_logprobs(engine, prompts, completions, adapters, temperature=1.0):
    """The pass this replaced: float32 logits at every position of the padded batch, log_softmax, gather."""
    b = engine._base("base")
    seqs = [p + c for p, c in zip(prompts, completions, strict=True)]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), b.tokenizer.pad_token_id)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
    with adapters_for(b, adapters) as kwargs:
        logits = b.model(input_ids=ids, attention_mask=mask, **kwargs).logits.float() / temperature
    logp = torch.log_softmax(logits[:, :-1], dim=-1)
    return [
        logp[i, len(p) - 1 : len(p) - 1 + len(c)].gather(-1, torch.tensor(c)[:, None])[:, 0]
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True))
    ]


def new_token_logprobs(engine, prompts, completions, adapters, temperature=1.0, chunk=None):
    from teamtr.engines.embedded_scoring import token_logprobs

    return token_logprobs(engine._base("base"), prompts, completions, adapters, temperature, chunk)


def lora_grads(engine, adapters, fn) -> dict[str, torch.Tensor]:
    params = {
        f"{a}:{k}": p
        for a in set(adapters) - {None}
        for k, p in engine.adapter_parameters(a).items()
        if p.requires_grad
    }
    for p in params.values():
        p.grad = None
    weights = torch.linspace(0.5, 1.5, sum(map(len, COMPLETIONS)))
    (torch.cat(fn()) * weights).sum().backward()
    out = {k: p.grad.clone() for k, p in params.items()}
    for p in params.values():
        p.grad = None
    return out


def assert_close(xs, ys, atol=1e-5):
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys, strict=True):
        assert x.shape == y.shape
        torch.testing.assert_close(x, y, atol=atol, rtol=0)


@pytest.mark.parametrize("adapters", [["r1", "r1", "r1"], ["r1", "r2", None], [None, None, None]])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_selective_equals_the_full_pass_without_grad(engine, adapters, temperature):
    with torch.no_grad():
        old = old_token_logprobs(engine, PROMPTS, COMPLETIONS, adapters, temperature)
        for chunk in (1, 3, None, 10_000):  # one position per chunk .. everything in one
            assert_close(new_token_logprobs(engine, PROMPTS, COMPLETIONS, adapters, temperature, chunk), old)


@pytest.mark.parametrize("adapters", [["r1", "r1", "r1"], ["r1", "r2", "r1"]])
def test_selective_equals_the_full_pass_with_grad(engine, adapters):
    old = old_token_logprobs(engine, PROMPTS, COMPLETIONS, adapters, 0.8)
    new = new_token_logprobs(engine, PROMPTS, COMPLETIONS, adapters, 0.8, chunk=2)
    assert all(t.requires_grad for t in new)
    assert_close([t.detach() for t in new], [t.detach() for t in old])
    g_old = lora_grads(
        engine, adapters, lambda: old_token_logprobs(engine, PROMPTS, COMPLETIONS, adapters, 0.8)
    )
    for chunk in (2, None):
        g_new = lora_grads(
            engine,
            adapters,
            lambda c=chunk: new_token_logprobs(engine, PROMPTS, COMPLETIONS, adapters, 0.8, c),
        )
        assert g_new.keys() == g_old.keys() and any(float(g.abs().sum()) > 0 for g in g_old.values())
        for k in g_old:
            torch.testing.assert_close(g_new[k], g_old[k], atol=1e-5, rtol=1e-4)


def saved_shapes(engine, fn) -> list[tuple[int, ...]]:
    """Shapes of the tensors autograd keeps for the backward pass while fn runs, the model's weights (and
    views of them) left out."""
    weights = {p.untyped_storage().data_ptr() for p in engine.model().parameters()}
    saved: list[tuple[int, ...]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in weights:
            saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return saved


def test_no_vocabulary_wide_tensor_is_kept_for_the_backward_pass(engine):
    vocab = engine.model().config.vocab_size
    for fn, keeps in ((old_token_logprobs, True), (new_token_logprobs, False)):
        saved = saved_shapes(engine, lambda f=fn: f(engine, PROMPTS, COMPLETIONS, ["r1"] * 3))
        wide = [s for s in saved if s and s[-1] == vocab]
        assert saved and bool(wide) == keeps, wide


def test_body_checkpointing_gives_the_same_values_and_gradients(tmp_path):
    path = build_tiny_model(tmp_path / "m", hidden=64, layers=2, heads=2)
    eng = EmbeddedEngine(path, adapters=dict.fromkeys(ADAPTERS), lora=LoraSettings(target_modules=ALL_LINEAR))
    randomise_adapters(eng, ADAPTERS, std=0.1, seed=0)
    one = ["r1"] * 3
    calls = []
    eng.model().get_base_model().model.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.append(1))
    plain = lora_grads(eng, one, lambda: new_token_logprobs(eng, PROMPTS, COMPLETIONS, one))
    assert len(calls) == 1
    values = new_token_logprobs(eng, PROMPTS, COMPLETIONS, one)
    assert not body_checkpointing(eng.model())
    enable_body_checkpointing(eng.model())
    assert body_checkpointing(eng.model())
    assert not any(m.training for m in eng.model().modules())  # the engine's model stays in eval mode
    calls.clear()
    checkpointed = lora_grads(eng, one, lambda: new_token_logprobs(eng, PROMPTS, COMPLETIONS, one))
    assert len(calls) == 2  # the layer ran again in the backward pass
    assert not any(m.training for m in eng.model().modules())
    assert_close(new_token_logprobs(eng, PROMPTS, COMPLETIONS, one), values)
    for k in plain:
        torch.testing.assert_close(checkpointed[k], plain[k], atol=1e-6, rtol=1e-5)
    # mixed adapters are never checkpointed (the recompute would run outside their dispatch): still exact
    mixed = ["r1", "r2", None]
    with torch.no_grad():
        old = old_token_logprobs(eng, PROMPTS, COMPLETIONS, mixed)
    assert_close([t.detach() for t in new_token_logprobs(eng, PROMPTS, COMPLETIONS, mixed)], old)


def brute_force(engine, cur, new, prompt, completion, t):
    """sum_u of KL(cur || new), KL(new || cur) over the vocabulary and log new - log cur of the sampled
    token, one unpadded forward per prefix, in float64."""
    model = engine.model()
    model.set_adapter("r1")
    fwd = rev = ratio = 0.0
    for u in range(len(completion)):
        ids = torch.tensor([prompt + completion[:u]])
        dists = []
        for weights in (cur, new):
            engine.restore_adapter("r1", weights)
            with torch.no_grad():
                dists.append(torch.log_softmax(model(input_ids=ids).logits[0, -1].double() / t, dim=-1))
        p, q = dists
        fwd += float((p.exp() * (p - q)).sum())
        rev += float((q.exp() * (q - p)).sum())
        ratio += float(q[completion[u]] - p[completion[u]])
    engine.restore_adapter("r1", new)
    return fwd, rev, ratio


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_message_kl_equals_a_brute_force_sum_over_the_vocabulary(engine, temperature):
    cur = engine.snapshot_adapter("r1")
    torch.manual_seed(1)
    with torch.no_grad():
        for p in engine.adapter_parameters("r1").values():
            p.add_(torch.randn_like(p) * 0.05)
    new = engine.snapshot_adapter("r1")
    side = Side(engine, "base", "r1")
    kl, ratio = message_divergences(side, PROMPTS, COMPLETIONS, cur, temperature, chunk=2)
    assert torch.equal(message_kl(side, PROMPTS, COMPLETIONS, cur, temperature, chunk=2).forward, kl.forward)
    for p in engine.adapter_parameters("r1").values():  # the adapter holds q (= new) again
        assert p.requires_grad
    assert all(torch.equal(new[k], v) for k, v in engine.snapshot_adapter("r1").items())
    for i, (p, c) in enumerate(zip(PROMPTS, COMPLETIONS, strict=True)):
        fwd, rev, lr = brute_force(engine, cur, new, p, c, temperature)
        assert fwd > 1e-4 and rev > 1e-4
        assert abs(float(kl.forward[i]) - fwd) < 1e-5
        assert abs(float(kl.reverse[i]) - rev) < 1e-5
        assert abs(float(ratio[i]) - lr) < 1e-5
    assert kl.tokens.tolist() == [len(c) for c in COMPLETIONS]
    empty = message_kl(side, [], [], cur)
    assert empty.forward.shape == (0,) and empty.reverse.shape == (0,)
    engine.restore_adapter("r1", cur)


def test_kept_pi_cur_states_give_bit_identical_kls_without_its_passes(engine, monkeypatch):
    """The trust region checks one set again and again against fixed pi_cur weights: with `before_states`
    pi_cur's body pass runs on the first call only and every KL is bit-identical to the uncached one."""
    cur = engine.snapshot_adapter("r1")
    side = Side(engine, "base", "r1")
    kept: list = []
    passes = []
    states = Side.states
    monkeypatch.setattr(Side, "states", lambda self, ps, cs: passes.append(len(ps)) or states(self, ps, cs))
    torch.manual_seed(2)
    for call in range(2):
        with torch.no_grad():
            for p in engine.adapter_parameters("r1").values():
                p.add_(torch.randn_like(p) * 0.05)
        passes.clear()
        cached, ratio_cached = message_divergences(side, PROMPTS, COMPLETIONS, cur, chunk=2, before_states=kept)
        assert len(kept) == 2 and passes == ([2, 2, 1, 1] if call == 0 else [2, 1])
        fresh, ratio = message_divergences(side, PROMPTS, COMPLETIONS, cur, chunk=2)
        assert float(fresh.forward.min()) > 1e-4
        for a, b in ((cached.forward, fresh.forward), (cached.reverse, fresh.reverse), (ratio_cached, ratio)):
            assert torch.equal(a, b)
    engine.restore_adapter("r1", cur)


def test_full_logprobs_holds_completion_positions_only(engine):
    side = Side(engine, "base", "r2")
    with torch.no_grad():
        full = full_logprobs(side, PROMPTS, COMPLETIONS, 0.9)
        sampled = old_token_logprobs(engine, PROMPTS, COMPLETIONS, ["r2"] * 3, 0.9)
    assert full.shape == (3, max(map(len, COMPLETIONS)), engine.model().config.vocab_size)
    for i, c in enumerate(COMPLETIONS):
        torch.testing.assert_close(full[i, range(len(c)), c], sampled[i], atol=1e-5, rtol=0)
        torch.testing.assert_close(full[i, : len(c)].exp().sum(-1), torch.ones(len(c)))
        assert float(full[i, len(c) :].abs().sum()) == 0  # padding


def test_budget_chunks_keep_passes_under_the_token_budget():
    lengths = [10, 10, 10, 50, 5, 5, 100, 3]
    chunks = budget_chunks(lengths, budget=60, max_messages=3)
    assert [i for c in chunks for i in range(*c)] == list(range(len(lengths)))  # in order, each once
    for s, e in chunks:
        assert e - s <= 3
        assert e - s == 1 or (e - s) * max(lengths[s:e]) <= 60  # padded tokens; a long message alone
    assert chunks == [(0, 3), (3, 4), (4, 6), (6, 7), (7, 8)]
    assert budget_chunks([], budget=60, max_messages=3) == []
    assert budget_chunks([4] * 10, budget=10**9, max_messages=64) == [(0, 10)]


def test_policy_logp_is_the_same_whatever_the_budget(engine):
    params = engine.adapter_parameters("r1")
    zeros, mask = pad([torch.zeros(len(c)) for c in COMPLETIONS])
    m = len(PROMPTS)
    msgs = RoleMessages(PROMPTS, COMPLETIONS, torch.arange(m), torch.zeros(m), torch.ones(m), mask, zeros)
    small = AdapterPolicy(
        engine, "r1", "base", params, torch.optim.AdamW(list(params.values())), token_budget=8
    )
    large = AdapterPolicy(engine, "r1", "base", params, torch.optim.AdamW(list(params.values())))
    torch.testing.assert_close(small.logp(msgs, grad=False), large.logp(msgs, grad=False), atol=1e-5, rtol=0)


def test_loss_backward_pass_by_pass_gives_the_one_graph_gradient(engine, monkeypatch):
    """A minibatch over several token-budget passes is backpropagated pass by pass (gradient caching):
    no forward pass with a gradient holds more than its budget's messages, and the adapter's gradient
    equals the one-graph gradient of a non-linear loss within 1e-5."""
    params = engine.adapter_parameters("r1")
    _, mask = pad([torch.zeros(len(c)) for c in COMPLETIONS])
    m = len(PROMPTS)
    weights = torch.linspace(0.5, 1.5, m)
    msgs = RoleMessages(PROMPTS, COMPLETIONS, torch.arange(m), torch.zeros(m), weights, mask, mask.float())

    def loss_of(logp):  # a ratio-like, non-linear function of every token's log-prob
        return ((logp.exp() - 1.0) ** 2 * mask).sum(-1).mul(weights).mean() - (logp * mask).sum() / 7

    def gradient(token_budget):
        policy = AdapterPolicy(
            engine, "r1", "base", params, torch.optim.AdamW(list(params.values())), token_budget=token_budget
        )
        policy.optimizer.zero_grad(set_to_none=True)
        loss = policy.loss_backward(msgs, loss_of)
        return loss, {k: p.grad.clone() for k, p in params.items() if p.grad is not None}

    passes: list[tuple[int, bool]] = []
    real = engine.token_logprobs
    monkeypatch.setattr(
        engine,
        "token_logprobs",
        lambda p, *a: passes.append((len(p), torch.is_grad_enabled())) or real(p, *a),
    )
    one_loss, one_graph = gradient(10**9)
    assert passes == [(3, True)]
    passes.clear()
    by_pass_loss, by_pass = gradient(10)  # each message (8-10 tokens) a pass of its own
    assert passes == [(1, False)] * 3 + [(1, True)] * 3  # log-probs without a gradient, then pass by pass
    torch.testing.assert_close(by_pass_loss, one_loss, atol=1e-6, rtol=0)
    assert one_graph.keys() == by_pass.keys() and one_graph
    for k, g in one_graph.items():
        assert g.abs().sum() > 0
        torch.testing.assert_close(by_pass[k], g, atol=1e-5, rtol=0)
