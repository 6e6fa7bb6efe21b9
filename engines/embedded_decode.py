"""The embedded engine's decoding loop (engines/embedded.py queues the calls and schedules the batches):
rows decoded together with one KV cache, left-padded, each row with its own adapter, sampling settings,
stop strings and seeded generator (engines/embedded_sampling.py).

`RunningBatch` holds the rows being decoded. `prefill` starts a group of new rows (one forward pass over
their prompts, which samples their first tokens); `step` decodes one more token for every row; `join`
adds a prefilled group to a running batch (engines/embedded_cache.py pads the two KV caches to one
length), so new rows can start at any step: continuous batching (engines/embedded.py, decode_in_thread).
There a row leaves the batch as soon as it finishes. `decode_batch` is the fixed-batch mode (training
rollouts): one group decoded to its end, finished rows kept in the batch as padding, so that the batch,
and with it every float, is the same on every run.

A row whose caller has gone (its future cancelled: a client disconnected, a deadline passed) leaves the
batch at the next decoding step: its KV-cache row, adapter slot and generator are dropped, it is no
longer computed or sampled, and it no longer holds the batch open. The other rows keep their seeded
generators and sample the same tokens; their log-probs can move in float32's last bits, as between any
two batch sizes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from teamtr.engines import embedded_cache
from teamtr.engines.embedded_adapters import adapters_for
from teamtr.engines.embedded_model import LoadedBase
from teamtr.engines.embedded_sampling import hits_stop, row_generator, sample_rows
from teamtr.graphs.engine import SamplingParams

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
    # token streaming (engines/embedded.py `generate(on_token=...)`): called with each new piece of text
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


class RunningBatch:
    """Rows decoded together. Row state lives in parallel lists and [rows, ...] tensors; every row has
    one sampled token (`next_ids`, at position `pos`) not yet in the KV cache, whose columns `mask` covers.
    `keep_finished`: finished rows stay as padding rows (fixed-batch mode) instead of leaving."""

    def __init__(self, b: LoadedBase, on_step: Callable[[int], None], keep_finished: bool = False) -> None:
        self.b, self.on_step, self.keep_finished = b, on_step, keep_finished
        self.rows: list[DecodeRequest] = []
        self.gens: list[torch.Generator | None] = []
        self.texts: list[str] = []  # decoded so far, for stop strings
        self.done: list[bool] = []
        dev = b.device
        self.temps = torch.zeros(0, device=dev)
        self.top_ps = torch.zeros(0, device=dev)
        self.next_ids = torch.zeros((0, 1), dtype=torch.long, device=dev)
        self.pos = torch.zeros((0, 1), dtype=torch.long, device=dev)
        self.mask = torch.zeros((0, 0), dtype=torch.long, device=dev)
        self.cache: Any = None

    def __len__(self) -> int:
        return len(self.rows)

    def adapters(self) -> set[str | None]:
        return {r.adapter for r in self.rows}

    def all_done(self) -> bool:
        return all(self.done)

    def joinable(self) -> bool:
        """Whether a prefilled group can join this batch now (an empty batch takes any group)."""
        return not self.rows or embedded_cache.joinable(self.cache)

    # ---- forward passes ---------------------------------------------------------------------------

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any
    ) -> tuple[Any, Any]:
        with adapters_for(self.b, [r.adapter for r in self.rows]) as kwargs:
            out = self.b.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=pos,
                use_cache=True,
                logits_to_keep=1,
                **{self.b.cache_kwarg: cache},
                **kwargs,
            )
        self.on_step(len(self.rows))
        return out.logits[:, -1].float(), out["cache"] if "cache" in out else out["past_key_values"]

    @classmethod
    @torch.no_grad()
    def prefill(
        cls,
        b: LoadedBase,
        group: list[DecodeRequest],
        on_step: Callable[[int], None],
        keep_finished: bool = False,
    ) -> RunningBatch:
        """A batch of `group`'s rows: one forward pass over their left-padded prompts, which samples each
        row's first token."""
        new = cls(b, on_step, keep_finished)
        width = max(len(r.prompt_ids) for r in group)
        ids = torch.full((len(group), width), b.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        for i, r in enumerate(group):
            ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            mask[i, width - len(r.prompt_ids) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        ids, mask, positions = ids.to(b.device), mask.to(b.device), positions.to(b.device)
        new.rows = list(group)
        new.gens = [row_generator(r.sampling.seed) for r in group]
        new.texts = [""] * len(group)
        new.done = [False] * len(group)
        new.temps = torch.tensor([r.sampling.temperature for r in group], device=b.device)
        new.top_ps = torch.tensor([r.sampling.top_p for r in group], device=b.device)
        logits, new.cache = new._forward(ids, mask, positions, None)
        new.mask, new.pos = mask, positions[:, -1:] + 1
        new._sample(logits)
        return new

    @torch.no_grad()
    def step(self) -> None:
        """Decode one token for every row."""
        ones = torch.ones((len(self.rows), 1), dtype=torch.long, device=self.b.device)
        mask = torch.cat([self.mask, ones], dim=1)
        logits, self.cache = self._forward(self.next_ids, mask, self.pos, self.cache)
        self.mask, self.pos = mask, self.pos + 1
        self._sample(logits)

    def _sample(self, logits: torch.Tensor) -> None:
        """One token per row, from its own distribution; records it and whether the row is now finished."""
        tok, eos = self.b.tokenizer, self.b.eos_ids
        # log-probs of the distribution each row sampled from (SamplingParams says which)
        next_tokens, logp = sample_rows(logits, self.temps, self.top_ps, self.gens)
        chosen = logp.gather(1, next_tokens[:, None])[:, 0].tolist()
        for i, (r, t) in enumerate(zip(self.rows, next_tokens.tolist(), strict=True)):
            if self.done[i]:
                next_tokens[i] = tok.pad_token_id
                continue
            r.completion.append(t)
            r.logprobs.append(chosen[i])
            if t in eos:
                self.done[i], r.finish_reason = True, "stop"
            elif r.sampling.stop and hits_stop(self.texts, i, self.b.piece(t), r.sampling.stop):
                self.done[i], r.finish_reason = True, "stop"
            elif len(r.completion) >= r.sampling.max_new_tokens:
                self.done[i], r.finish_reason = True, "length"
            r.stream_text(tok, final=self.done[i])
        self.next_ids = next_tokens[:, None]

    # ---- rows joining and leaving -----------------------------------------------------------------

    def join(self, group: RunningBatch) -> None:
        """Add a prefilled group's rows after this batch's (its finished rows are gone already)."""
        if not self.rows:
            self.__dict__.update(
                {k: v for k, v in group.__dict__.items() if k not in ("on_step", "keep_finished")}
            )
            return
        self.mask = embedded_cache.join(self.cache, self.mask, group.cache, group.mask)
        self.rows += group.rows
        self.gens += group.gens
        self.texts += group.texts
        self.done += group.done
        self.temps, self.top_ps, self.next_ids, self.pos = (
            torch.cat([mine, theirs])
            for mine, theirs in (
                (self.temps, group.temps),
                (self.top_ps, group.top_ps),
                (self.next_ids, group.next_ids),
                (self.pos, group.pos),
            )
        )

    def _keep(self, keep: list[int]) -> None:
        self.rows, self.gens, self.texts, self.done = (
            [xs[i] for i in keep] for xs in (self.rows, self.gens, self.texts, self.done)
        )
        index = torch.tensor(keep, dtype=torch.long, device=self.b.device)
        self.temps, self.top_ps, self.next_ids, self.pos, self.mask = (
            t.index_select(0, index) for t in (self.temps, self.top_ps, self.next_ids, self.pos, self.mask)
        )
        if self.rows and self.cache is not None:
            self.cache.batch_select_indices(index)
            if not self.keep_finished and embedded_cache.joinable(self.cache):
                self.mask = embedded_cache.trim_front(self.cache, self.mask)
        elif not self.rows:
            self.cache = None
            self.mask = self.mask[:, :0]

    def drop_cancelled(self) -> int:
        """Take out the rows whose callers have gone (finish_reason CANCELLED); how many left."""
        keep = [i for i, r in enumerate(self.rows) if not r.cancelled()]
        gone = len(self.rows) - len(keep)
        if gone:
            for r in self.rows:
                if r.cancelled():
                    r.finish_reason = CANCELLED
            self._keep(keep)
        return gone

    def take_finished(self) -> list[DecodeRequest]:
        """Take out the finished rows (continuous mode: they leave at once) and return them."""
        finished = [r for r, d in zip(self.rows, self.done, strict=True) if d]
        if finished:
            self._keep([i for i, d in enumerate(self.done) if not d])
        return finished


@torch.no_grad()
def decode_batch(b: LoadedBase, batch: list[DecodeRequest], on_step: Callable[[int], None]) -> None:
    """Fixed-batch mode: decode `batch` to its end, finished rows staying as padding rows.
    `on_step(rows)` is called after every forward pass with the number of rows it computed."""
    for r in batch:
        if r.cancelled():
            r.finish_reason = CANCELLED
    group = [r for r in batch if not r.cancelled()]
    if not group:
        return
    rows = RunningBatch.prefill(b, group, on_step, keep_finished=True)
    while not rows.all_done():
        rows.drop_cancelled()
        if not rows or rows.all_done():
            break
        rows.step()
