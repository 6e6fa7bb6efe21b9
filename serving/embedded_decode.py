"""The embedded engine's decoding loop (serving/embedded.py queues the calls and forms the batches):
one batch of `generate` calls decoded together with a KV cache, rows left-padded, each row with its own
adapter, sampling settings, stop strings and seeded generator (serving/embedded_sampling.py).

A row whose caller has gone (its future cancelled: a client disconnected, a deadline passed) leaves the
batch at the next decoding step: its KV-cache row, adapter slot and generator are dropped, it is no
longer computed or sampled, and it no longer holds the batch open. A batch without cancellations decodes
exactly as it always has. The other rows of a batch that loses one keep their seeded generators and
sample the same tokens; their log-probs can move in float32's last bits, as between any two batch sizes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from teamtr.graphs.engine import SamplingParams
from teamtr.serving.embedded_adapters import adapters_for
from teamtr.serving.embedded_model import LoadedBase
from teamtr.serving.embedded_sampling import hits_stop, row_generator, sample_rows

CANCELLED = "cancelled"  # finish_reason of a row dropped because its caller went away (never returned)


@dataclass
class DecodeRequest:
    prompt_ids: list[int]
    adapter: str | None
    sampling: SamplingParams
    future: asyncio.Future
    # filled while decoding
    completion: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    # token streaming (serving/embedded.py `generate(on_token=...)`): called with each new piece of text
    on_token: Callable[[str], None] | None = None
    streamed: str = ""  # the text already passed to on_token

    def stream_text(self, tokenizer: Any, final: bool = False) -> None:
        """Pass on_token the text the tokens so far add (decoding them all, so that multi-byte characters
        split over tokens come out whole); a trailing incomplete character waits for its next token."""
        if self.on_token is None:
            return
        text = tokenizer.decode(self.completion, skip_special_tokens=True)
        if (not final and text.endswith("\ufffd")) or not text.startswith(self.streamed):
            return
        if len(text) > len(self.streamed):
            delta, self.streamed = text[len(self.streamed) :], text
            self.on_token(delta)

    def cancelled(self) -> bool:
        # Read from the decoding thread too (decode_in_thread): a plain state read, set once by the loop.
        return self.future.cancelled()


@torch.no_grad()
def decode_batch(b: LoadedBase, batch: list[DecodeRequest], on_step: Callable[[int], None]) -> None:
    """Batched sampling with a KV cache; rows are left-padded, each row keeps its own settings.
    `on_step(rows)` is called after every forward pass with the number of rows it computed."""
    tok = b.tokenizer
    width = max(len(r.prompt_ids) for r in batch)
    ids = torch.full((len(batch), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, r in enumerate(batch):
        ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
        mask[i, width - len(r.prompt_ids) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    ids, mask, positions = ids.to(b.device), mask.to(b.device), positions.to(b.device)
    rows = list(batch)  # the rows still in the batch's tensors, in order
    gens = [row_generator(r.sampling.seed) for r in rows]
    temps = torch.tensor([r.sampling.temperature for r in rows], device=b.device)
    top_ps = torch.tensor([r.sampling.top_p for r in rows], device=b.device)
    limits = [r.sampling.max_new_tokens for r in rows]
    texts = [""] * len(rows)  # decoded so far, for stop strings
    done = [False] * len(rows)
    eos = b.eos_ids
    past = None
    step_ids, step_pos = ids, positions
    with adapters_for(b, [r.adapter for r in rows]) as kwargs:
        for _ in range(max(limits)):
            keep = [i for i, r in enumerate(rows) if not r.cancelled()]
            if len(keep) < len(rows):  # callers gone since the last step: their rows leave the batch
                for r in rows:
                    if r.cancelled():
                        r.finish_reason = CANCELLED
                rows, gens, limits, texts, done = (
                    [xs[i] for i in keep] for xs in (rows, gens, limits, texts, done)
                )
                if not rows or all(done):
                    break
                index = torch.tensor(keep, device=b.device)
                temps, top_ps, step_ids, step_pos, mask = (
                    t.index_select(0, index) for t in (temps, top_ps, step_ids, step_pos, mask)
                )
                if past is not None:
                    past.batch_select_indices(index)
                if "adapter_names" in kwargs:
                    kwargs["adapter_names"] = [kwargs["adapter_names"][i] for i in keep]
            out = b.model(
                input_ids=step_ids,
                attention_mask=mask,
                position_ids=step_pos,
                use_cache=True,
                logits_to_keep=1,
                **{b.cache_kwarg: past},
                **kwargs,
            )
            on_step(len(rows))
            past = out["cache"] if "cache" in out else out["past_key_values"]
            logits = out.logits[:, -1].float()
            # log-probs of the distribution each row sampled from (SamplingParams says which)
            next_tokens, logp = sample_rows(logits, temps, top_ps, gens)
            chosen = logp.gather(1, next_tokens[:, None])[:, 0].tolist()
            for i, (r, t) in enumerate(zip(rows, next_tokens.tolist(), strict=True)):
                if done[i]:
                    next_tokens[i] = tok.pad_token_id
                    continue
                r.completion.append(t)
                r.logprobs.append(chosen[i])
                if t in eos:
                    done[i], r.finish_reason = True, "stop"
                elif r.sampling.stop and hits_stop(texts, i, b.piece(t), r.sampling.stop):
                    done[i], r.finish_reason = True, "stop"
                elif len(r.completion) >= limits[i]:
                    done[i], r.finish_reason = True, "length"
                r.stream_text(tok, final=done[i])
            if all(done):
                break
            step_ids = next_tokens[:, None]
            step_pos = step_pos[:, -1:] + 1
            ones = torch.ones((len(rows), 1), dtype=torch.long, device=b.device)
            mask = torch.cat([mask, ones], dim=1)
