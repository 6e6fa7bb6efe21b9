"""Exact, differentiable log-probs of given completions on the embedded engine (engines/embedded.py):
the trainer's path, and `Engine.score`.

Memory does not grow with tokens x vocabulary (a selective log-softmax): the model body runs once over
the padded batch and its last hidden states are kept only at the positions that predict a completion
token; the LM head is applied there a chunk of positions at a time, and log pi(x_u) = logit[x_u] -
logsumexp(logits) is taken per chunk under activation checkpointing, so neither the forward nor the
backward pass holds float32 logits of more than one chunk ([positions, vocabulary], about
LOGIT_CHUNK_BYTES). The model's own LM head runs at one position per row only (`logits_to_keep=1`).
Optionally the body's decoder layers are checkpointed too (`enable_body_checkpointing`).
The same pieces give training/vocab_kl.py its exact KL, chunked the same way.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
from peft import PeftModel
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer

from teamtr.engines.embedded_adapters import adapters_for
from teamtr.engines.embedded_model import LoadedBase

# float32 logits of one chunk of positions: 128 MiB is 220 positions of Qwen3's 151,936-token vocabulary
# (a [220, 4096] x [4096, 151,936] matmul, large enough for a GPU), 1,048 of a 32,000-token one: the chunk's
# memory is the same whatever the vocabulary; its backward holds about 4 such tensors
LOGIT_CHUNK_BYTES = 128 * 2**20


def position_chunk(vocab_size: int, chunk_bytes: int = LOGIT_CHUNK_BYTES) -> int:
    """Positions per LM-head chunk so that one chunk's float32 logits take about `chunk_bytes`."""
    return max(1, chunk_bytes // (4 * vocab_size))


def _hf(model: PreTrainedModel | PeftModel) -> PreTrainedModel:
    """The transformers model under a peft wrapper (LoRA layers injected in place)."""
    return model.get_base_model() if isinstance(model, PeftModel) else model


def _checkpointable_layers(model: PreTrainedModel | PeftModel) -> list[GradientCheckpointingLayer]:
    return [m for m in _hf(model).modules() if isinstance(m, GradientCheckpointingLayer)]


def enable_body_checkpointing(model: PreTrainedModel | PeftModel) -> None:
    """Checkpoint every decoder layer in the log-prob passes with a gradient (transformers' own activation
    checkpointing, non-reentrant): activations are recomputed in the backward pass instead of kept."""
    hf = _hf(model)
    if body_checkpointing(model):
        return
    if hasattr(hf, "activation_checkpointing_enable"):  # transformers >= 5.2x; the older name warns there
        hf.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def body_checkpointing(model: PreTrainedModel | PeftModel) -> bool:
    return any(m.gradient_checkpointing for m in _checkpointable_layers(model))


@dataclass
class LMHead:
    """The model's output layer as its forward applies it (Gemma-style final softcapping included)."""

    module: torch.nn.Module
    softcap: float | None = None

    @classmethod
    def of(cls, model: PreTrainedModel | PeftModel) -> LMHead:
        hf = _hf(model)
        return cls(hf.get_output_embeddings(), getattr(hf.config, "final_logit_softcapping", None))

    def raw(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.module(hidden)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def logits(self, hidden: torch.Tensor, temperature: float) -> torch.Tensor:
        """float32 logits / T."""
        logits = self.raw(hidden).float()
        return logits / temperature if temperature != 1.0 else logits


@dataclass
class CompletionStates:
    """The body's last hidden state at each position that predicts a completion token, all messages' in a
    row: message i's tokens are rows sum(lengths[:i]) .. + lengths[i]."""

    hidden: torch.Tensor  # [N, H], differentiable when computed with a gradient
    targets: torch.Tensor  # [N] the completion tokens
    lengths: list[int]  # completion tokens per message
    head: LMHead

    def message_index(self) -> torch.Tensor:
        """[N] which message each row belongs to."""
        counts = torch.tensor(self.lengths, device=self.hidden.device)
        return torch.repeat_interleave(torch.arange(len(self.lengths), device=self.hidden.device), counts)


def padded_batch(
    pad: int, prompts: list[list[int]], completions: list[list[int]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) [M, width] of prompt + completion, right-padded: positions are plain 0..len-1."""
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask


def completion_states(
    model: PreTrainedModel | PeftModel,
    pad: int,
    prompts: list[list[int]],
    completions: list[list[int]],
    forward_kwargs: dict | None = None,
    checkpoint_body: bool = False,
) -> CompletionStates:
    """One forward of the body over the padded batch (adapters as `forward_kwargs` / the active adapter set
    them); its last hidden states kept at the completion positions only. `checkpoint_body`: with a
    gradient and body checkpointing enabled on the model, the decoder layers are checkpointed."""
    if any(len(p) == 0 for p in prompts):
        raise ValueError(
            "every prompt needs at least one token (the first completion token is predicted from it)"
        )
    hf = _hf(model)
    device = next(hf.parameters()).device
    ids, mask = padded_batch(pad, prompts, completions)
    captured: list[torch.Tensor] = []
    thread = threading.get_ident()

    def keep(_module: torch.nn.Module, _args: tuple, output: object) -> None:
        if threading.get_ident() == thread:  # not a forward the serving engine's decode thread runs meanwhile
            captured.append(output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0])

    kwargs = dict(forward_kwargs or {})
    if "logits_to_keep" in inspect.signature(type(hf).forward).parameters:
        kwargs["logits_to_keep"] = 1  # the model's own head at the last position only (checked below)
    # transformers checkpoints a layer only in training mode: flip that flag on the layers alone (dropout
    # and the rest stay in eval mode), for this forward
    layers = (
        [m for m in _checkpointable_layers(model) if m.gradient_checkpointing]
        if checkpoint_body and torch.is_grad_enabled()
        else []
    )
    handle = hf.get_decoder().register_forward_hook(keep)
    was_training = [m.training for m in layers]
    try:
        for m in layers:
            m.training = True
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False, **kwargs)
    finally:
        handle.remove()
        for m, t in zip(layers, was_training, strict=True):
            m.training = t
    (hidden,) = captured
    head = LMHead.of(model)
    with torch.no_grad():  # the head applied here must be the model's: same logits at the last position
        mine, theirs = head.raw(hidden[:, -1:]).float(), out.logits[:, -1:].float()
        # (equal_nan: weights a refused step made non-finite give NaN logits both ways; the trainer
        # decides on them, this check must not)
        if not torch.allclose(mine, theirs, rtol=1e-3, atol=1e-3, equal_nan=True):
            raise ValueError(
                f"{type(hf).__name__}: logits differ from its output layer applied to the last hidden state "
                "(a transformation after the LM head this scorer does not know)"
            )
    del out
    width = ids.shape[1]
    flat = [
        i * width + len(p) - 1 + u
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True))
        for u in range(len(c))
    ]
    hidden = hidden.reshape(-1, hidden.shape[-1]).index_select(
        0, torch.tensor(flat, dtype=torch.long, device=device)
    )
    targets = torch.tensor([t for c in completions for t in c], dtype=torch.long, device=device)
    return CompletionStates(hidden, targets, [len(c) for c in completions], head)


def in_chunks(
    fn: Callable[..., torch.Tensor], n: int, chunk: int, *tensors: torch.Tensor
) -> list[torch.Tensor]:
    """fn over rows [s, s + chunk) of each tensor; with a gradient each chunk is checkpointed (its
    intermediates, the [chunk, V] logits, are recomputed in the backward pass instead of kept)."""
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    out = []
    for s in range(0, n, chunk):
        part = [t[s : s + chunk] for t in tensors]
        if grad:
            out.append(checkpoint(fn, *part, use_reentrant=False))
        else:
            out.append(fn(*part))
    return out


def selective_logprobs(
    states: CompletionStates, temperature: float = 1.0, chunk: int | None = None
) -> torch.Tensor:
    """[N] log pi_T(x_u | prefix) = logit[x_u] / T - logsumexp(logits / T), `chunk` positions at a time
    (default: about LOGIT_CHUNK_BYTES of float32 logits)."""
    head = states.head

    def logp(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        logits = head.logits(h, temperature)
        return logits.gather(-1, t[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)

    n = len(states.targets)
    if n == 0:
        return states.hidden.new_zeros(0, dtype=torch.float32)
    chunk = chunk or position_chunk(head.module.weight.shape[0])
    return torch.cat(in_chunks(logp, n, chunk, states.hidden, states.targets))


def token_logprobs(
    b: LoadedBase,
    prompts: list[list[int]],
    completions: list[list[int]],
    adapters: list[str | None],
    temperature: float = 1.0,
    chunk: int | None = None,
) -> list[torch.Tensor]:
    """log pi(x_u | prompt, x_<u) for each completion token, one adapter per sequence, differentiable.
    `temperature` T > 0 gives log pi_T = log softmax(logits / T), what sampling at T records. `chunk`:
    positions per LM-head chunk (default: about LOGIT_CHUNK_BYTES of float32 logits each).
    Body checkpointing (when enabled on the model) applies to passes of one named adapter: a recompute in
    the backward pass runs outside this call, where only the active adapter is still in place."""
    if temperature <= 0:
        raise ValueError("token_logprobs needs a temperature > 0 (greedy has no log-probs to score)")
    if len(prompts) != len(completions):
        raise ValueError("prompts and completions differ in length")
    if not prompts:
        return []
    one_adapter = len(set(adapters)) == 1 and adapters[0] is not None
    with adapters_for(b, adapters) as kwargs:
        states = completion_states(
            b.model, b.tokenizer.pad_token_id, prompts, completions, kwargs, checkpoint_body=one_adapter
        )
        logp = selective_logprobs(states, temperature, chunk)
    return list(logp.split(states.lengths))
