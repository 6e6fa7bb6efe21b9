"""The embedded engine: transformers + peft in this process, no server.

One or more base models, each with one LoRA adapter per role (peft named adapters) and the
adapter-disabled reference. Many episodes run concurrently (asyncio): their pending `generate` calls are
decoded together, one batched forward pass per decoding step, each row with its own adapter (peft's mixed
adapter batches), its own sampling settings and its own seeded random generator (so a seeded call samples
the same tokens whatever else is in its batch).

Two schedules:
- fixed batches (the default; training rollouts): a batch is formed when the event loop has gone quiet
  (every episode in flight is waiting on the engine or finished) and decoded to its end on the loop, so
  batch composition, and with it every float, is the same on every run;
- continuous batching (`decode_in_thread`; serving): decoding runs in a worker thread one step at a time;
  before every step the calls that arrived meanwhile are prefilled and join the running batch (per-row KV
  cache, engines/embedded_cache.py), and a finished row leaves at once. Adapters are loaded and unloaded
  between steps; one that running rows use changes once they have finished.
A call whose caller is cancelled before it joins a batch is dropped; one cancelled mid-decode leaves its
batch at the next step (engines/embedded_decode.py).

This module queues the calls and schedules the batches; the rest is split by job:
engines/embedded_model.py (loading a base model), engines/embedded_adapters.py (named LoRA adapters),
engines/embedded_decode.py (prefill, decoding steps, rows joining and leaving), engines/embedded_cache.py
(joining KV caches), engines/embedded_sampling.py (per-row sampling), engines/embedded_scoring.py (exact
log-probs of given tokens).

The engine's public surface (models, adapters, scoring, generation) and its two schedulers share the
queues, locks and counters kept here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from teamtr.engines import embedded_adapters as adapters_
from teamtr.engines.devices import DtypeSpec, resolve_device, resolve_dtype
from teamtr.engines.embedded_adapters import LoraSettings
from teamtr.engines.embedded_decode import CANCELLED, DecodeRequest, RunningBatch, decode_batch
from teamtr.engines.embedded_model import LoadedBase, load_tokenizer, set_torch_threads
from teamtr.engines.embedded_scoring import token_logprobs
from teamtr.graphs.engine import DEFAULT_BASE, Generation, SamplingParams

__all__ = ["EmbeddedEngine", "LoraSettings", "load_tokenizer"]


class EmbeddedEngine:
    """Implements the `Engine` protocol (graphs/engine.py) in process."""

    streams_tokens = True  # `generate(on_token=...)` is called with each decoded piece of text

    def __init__(
        self,
        bases: dict[str, str | Path] | str | Path,
        *,
        adapters: dict[str, str | None] | None = None,
        lora: LoraSettings | None = None,
        device: str | torch.device = "auto",
        dtype: DtypeSpec | torch.dtype = "auto",
        threads: int | None = None,
        max_batch: int = 64,
        decode_in_thread: bool = False,
    ) -> None:
        """`bases`: base name -> model reference (a single one means one base named "base"): a Hugging Face
        folder, a hub id, or a .gguf file (converted once into a cached folder; engines/models.py).
        `adapters`: adapter name -> peft adapter dir to load, or None to create a fresh LoRA adapter
        (B = 0, so it starts equal to the base) on the default base.
        `device`: auto | cpu | cuda | cuda:K; `dtype`: auto | float32 | bfloat16 | float16 (or a torch
        dtype). auto = the first GPU in bfloat16 when torch sees one, else the CPU in float32
        (engines/devices.py); a GPU asked for where there is none fails here, before any model loads.
        `decode_in_thread`: continuous batching in a worker thread (serving): calls arriving mid-decode join
        at the next step. Batch composition then depends on timing: a seeded call samples the same tokens,
        its log-probs can move in float32's last bits. Off by default: training rollouts want reproducible
        batches."""
        set_torch_threads(threads)
        if not isinstance(bases, dict):
            bases = {DEFAULT_BASE: bases}
        if not bases:
            raise ValueError("an engine needs at least one base model")
        models = ", ".join(str(p) for p in bases.values())
        self.device = resolve_device(device, model=models)
        self.dtype = resolve_dtype(dtype, self.device)
        self._bases = {name: LoadedBase(path, self.dtype, self.device) for name, path in bases.items()}
        self.lora = lora or LoraSettings()
        self.max_batch = max_batch
        self.decode_in_thread = decode_in_thread
        self._pending: dict[str, list[DecodeRequest]] = {b: [] for b in self._bases}
        self._workers: dict[str, asyncio.Task] = {}
        # continuous batching (decode_in_thread): per base, the rows being decoded, a lock + condition
        # (decoding steps vs adapter changes) and the adapters being changed (their calls wait)
        self._running = {name: RunningBatch(b, self._count_step) for name, b in self._bases.items()}
        self._conditions: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Condition]] = {}
        self._held: dict[str, dict[str, int]] = {b: {} for b in self._bases}
        # Counters (cumulative; for tests, benchmarks and metrics)
        self.forward_batches = 0  # decoding forward passes run (a batched step counts once)
        self.decoded_rows = 0  # rows those passes computed (a batch of 8 decoding 3 steps: 24)
        self.decode_batches = 0  # batches of generate calls decoded together (prefilled together)
        self.joined_running = 0  # calls that joined a batch already decoding (continuous batching)
        self.generate_calls = 0
        self.cancelled_calls = 0  # calls whose caller went away before the result: dropped or cut short
        # Called with the number of rows after every decoding forward pass (in the decoding thread when
        # decode_in_thread); None: nothing is called.
        self.step_listener: Callable[[int], None] | None = None
        for name, path in (adapters or {}).items():
            if path is None:
                self.add_adapter(name)
            else:
                self.load_adapter_sync(name, path)

    # ---- models, tokenizers ----------------------------------------------------------------------------

    def _base(self, base: str) -> LoadedBase:
        try:
            return self._bases[base]
        except KeyError:
            raise KeyError(f"unknown base model {base!r}; engine has {sorted(self._bases)}") from None

    def tokenizer(self, base: str = DEFAULT_BASE) -> PreTrainedTokenizerFast:
        return self._base(base).tokenizer

    def base_models(self) -> list[str]:
        return list(self._bases)

    def base_path(self, base: str = DEFAULT_BASE) -> str:
        return self._base(base).path

    def model(self, base: str = DEFAULT_BASE) -> PreTrainedModel | PeftModel:
        """The torch model (a PeftModel once adapters exist): the trainer computes grads through it."""
        return self._base(base).model

    # ---- adapters (engines/embedded_adapters.py) ------------------------------------------------------

    def adapters(self, base: str = DEFAULT_BASE) -> list[str]:
        return self._base(base).adapter_names()

    def adapter_version(self, adapter: str | None, base: str = DEFAULT_BASE) -> int:
        if adapter is None:
            return 0
        return adapters_.adapter_version(self._base(base), adapter, base)

    def add_adapter(self, name: str, base: str = DEFAULT_BASE, config: LoraConfig | None = None) -> None:
        """A fresh LoRA adapter (peft init: B = 0, so it starts exactly equal to the base)."""
        adapters_.add_adapter(self._base(base), name, config or self.lora.peft_config(), base)

    def load_adapter_sync(self, name: str, path: str | Path, base: str = DEFAULT_BASE) -> None:
        """Load a peft adapter dir under `name` (replacing an adapter of that name); bumps its version."""
        adapters_.load_adapter(self._base(base), name, path)

    async def load_adapter(self, name: str, path: str, base: str = DEFAULT_BASE) -> None:
        await self._change_adapter(name, base, lambda: self.load_adapter_sync(name, path, base))

    async def unload_adapter(self, name: str, base: str = DEFAULT_BASE) -> None:
        await self._change_adapter(name, base, lambda: adapters_.unload_adapter(self._base(base), name))

    def save_adapter(self, name: str, out_dir: str | Path, base: str = DEFAULT_BASE) -> Path:
        """peft's standard format (adapter_config.json + adapter_model.safetensors) in `out_dir`."""
        self.adapter_version(name, base)
        return adapters_.save_adapter(self._base(base), name, out_dir)

    def adapter_parameters(self, name: str, base: str = DEFAULT_BASE) -> dict[str, torch.nn.Parameter]:
        """The LoRA parameters of one adapter (what the trainer optimises for that role)."""
        self.adapter_version(name, base)
        return adapters_.adapter_parameters(self._base(base), name)

    def snapshot_adapter(self, name: str, base: str = DEFAULT_BASE) -> dict[str, torch.Tensor]:
        return {k: p.detach().clone() for k, p in self.adapter_parameters(name, base).items()}

    def restore_adapter(self, name: str, snapshot: dict[str, torch.Tensor], base: str = DEFAULT_BASE) -> None:
        """Put exactly these weights back (backtracking a rejected update)."""
        self.adapter_version(name, base)
        adapters_.restore_adapter(self._base(base), name, snapshot)

    def commit_adapter_update(self, name: str, base: str = DEFAULT_BASE) -> int:
        """Mark new weights of `name` as live: the next rollouts record the new version."""
        b = self._base(base)
        b.versions[name] = self.adapter_version(name, base) + 1
        return b.versions[name]

    # ---- scoring (engines/embedded_scoring.py) --------------------------------------------------------

    def token_logprobs(
        self,
        prompts: list[list[int]],
        completions: list[list[int]],
        adapter: str | None | list[str | None],
        base: str = DEFAULT_BASE,
        temperature: float = 1.0,
    ) -> list[torch.Tensor]:
        """log pi(x_u | prompt, x_<u) for each completion token, differentiable (the trainer's path).
        `temperature` T > 0 gives log pi_T = log softmax(logits / T), what sampling at T records."""
        adapters = adapter if isinstance(adapter, list) else [adapter] * len(prompts)
        return token_logprobs(self._base(base), prompts, completions, adapters, temperature)

    @torch.no_grad()
    def score(
        self,
        prompts: list[list[int]],
        completions: list[list[int]],
        adapter: str | None,
        base: str = DEFAULT_BASE,
    ) -> list[list[float]]:
        return [t.tolist() for t in self.token_logprobs(prompts, completions, adapter, base)]

    # ---- generation ------------------------------------------------------------------------------------

    async def generate(
        self,
        prompt_ids: list[int],
        *,
        adapter: str | None,
        sampling: SamplingParams,
        base: str = DEFAULT_BASE,
        on_token: Callable[[str], None] | None = None,
    ) -> Generation:
        """`on_token`: called with each new piece of the text as it is decoded (in the decoding thread when
        decode_in_thread); the pieces add up to the Generation's text. It changes nothing sampled."""
        b = self._base(base)
        if not prompt_ids:
            raise ValueError("empty prompt")
        version = self.adapter_version(adapter, base)
        loop = asyncio.get_running_loop()
        req = DecodeRequest(list(prompt_ids), adapter, sampling, loop.create_future(), on_token=on_token)
        self._pending[base].append(req)
        self.generate_calls += 1
        worker = self._workers.get(base)
        if worker is None or worker.done() or worker.get_loop() is not loop:
            worker_loop = self._continuous_worker if self.decode_in_thread else self._worker
            self._workers[base] = loop.create_task(worker_loop(base))
        await req.future  # cancelling the caller cancels this future: the worker drops the call
        return Generation(
            prompt_ids=req.prompt_ids,
            completion_ids=req.completion,
            logprobs=req.logprobs,
            text=b.tokenizer.decode(req.completion, skip_special_tokens=True),
            finish_reason=req.finish_reason or "length",
            adapter=adapter,
            adapter_version=version,
            base_model=base,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
        )

    def _drop_cancelled(self, pending: list[DecodeRequest]) -> None:
        live = [r for r in pending if not r.cancelled()]
        self.cancelled_calls += len(pending) - len(live)
        pending[:] = live

    # ---- fixed batches (training rollouts) --------------------------------------------------------------

    async def _worker(self, base: str) -> None:
        """Gather pending calls until the event loop is quiet, then decode them as one batch."""
        pending = self._pending[base]
        while pending:
            seen, quiet = -1, 0
            while quiet < 16 and len(pending) < self.max_batch:  # every episode in flight has had its say
                await asyncio.sleep(0)
                quiet = quiet + 1 if len(pending) == seen else 0
                seen = len(pending)
            self._drop_cancelled(pending)  # callers already gone take no place in the batch
            batch, pending[:] = pending[: self.max_batch], pending[self.max_batch :]
            if not batch:
                continue
            try:
                self._decode(self._base(base), batch)
            except Exception as e:  # fail the callers, keep the engine alive
                self._fail(batch, e)
                continue
            self._finish(batch)

    def _decode(self, b: LoadedBase, batch: list[DecodeRequest]) -> None:
        self.decode_batches += 1
        decode_batch(b, batch, self._count_step)
        self.cancelled_calls += sum(r.finish_reason == CANCELLED for r in batch)

    # ---- continuous batching (serving) ------------------------------------------------------------------

    async def _continuous_worker(self, base: str) -> None:
        """Decode in a thread, one step at a time; before each step, the calls that arrived meanwhile are
        prefilled and join the running batch, and after it the finished rows leave and are answered."""
        b, pending, cond = self._base(base), self._pending[base], self._condition(base)
        while pending or self._running[base]:
            running = self._running[base]
            async with cond:  # adapters change only between steps (engines/embedded.py _change_adapter)
                self._drop_cancelled(pending)
                group = self._admissible(base, running)
                if not group and not running:
                    if pending:  # only calls for an adapter being changed: wait until it is
                        await cond.wait()
                    continue
                if group:
                    self.decode_batches += 1
                    self.joined_running += len(group) if running else 0
                try:
                    finished, gone = await asyncio.to_thread(self._advance, b, running, group)
                except Exception as e:  # fail the callers, keep the engine alive
                    self._fail(list({id(r): r for r in running.rows + group}.values()), e)
                    self._running[base] = RunningBatch(b, self._count_step)
                    cond.notify_all()
                    continue
                self.cancelled_calls += gone
                cond.notify_all()
            self._finish(finished)

    def _admissible(self, base: str, running: RunningBatch) -> list[DecodeRequest]:
        """Take the pending calls that may join `running` now: up to max_batch rows, none for an adapter
        being changed; a call for an unknown adapter fails alone."""
        if not running.joinable():  # a cache that cannot be joined (engines/embedded_cache.py)
            return []
        b, pending, held = self._base(base), self._pending[base], self._held[base]
        group, waiting = [], []
        for r in pending:
            if r.adapter is not None and r.adapter not in b.versions and r.adapter not in held:
                r.future.set_exception(KeyError(f"unknown adapter {r.adapter!r}; have {b.adapter_names()}"))
            elif len(running) + len(group) < self.max_batch and r.adapter not in held:
                group.append(r)
            else:
                waiting.append(r)
        pending[:] = waiting
        return group

    def _advance(
        self, b: LoadedBase, running: RunningBatch, group: list[DecodeRequest]
    ) -> tuple[list[DecodeRequest], int]:
        """One iteration (in the decoding thread): cancelled rows leave, `group` is prefilled and joins,
        every row decodes a token. Returns the rows that finished and how many rows were cancelled."""
        gone = running.drop_cancelled()
        finished: list[DecodeRequest] = []
        if group:
            newcomers = RunningBatch.prefill(b, group, self._count_step)
            finished += newcomers.take_finished()
            if newcomers:
                running.join(newcomers)
        if running:
            running.step()
            finished += running.take_finished()
        return finished, gone

    async def _change_adapter(self, name: str, base: str, change: Callable[[], None]) -> None:
        """Run `change` between two decoding steps, once no running row uses adapter `name` (calls for it
        wait meanwhile): a generation never mixes two versions of its adapter."""
        if not self.decode_in_thread:
            change()  # decoding runs on this loop: never under a change
            return
        held, cond = self._held[base], self._condition(base)
        held[name] = held.get(name, 0) + 1
        async with cond:
            try:
                await cond.wait_for(lambda: name not in self._running[base].adapters())
                change()
            finally:
                held[name] -= 1
                if not held[name]:
                    del held[name]
                cond.notify_all()

    def _condition(self, base: str) -> asyncio.Condition:
        """The base's lock (with its condition), made for the running event loop."""
        loop = asyncio.get_running_loop()
        made = self._conditions.get(base)
        if made is None or made[0] is not loop:
            made = self._conditions[base] = (loop, asyncio.Condition())
        return made[1]

    # ---- answers and counters ---------------------------------------------------------------------------

    @staticmethod
    def _fail(requests: list[DecodeRequest], error: Exception) -> None:
        for r in requests:
            if not r.future.done():
                r.future.set_exception(error)

    @staticmethod
    def _finish(requests: list[DecodeRequest]) -> None:
        for r in requests:
            if not r.future.done():
                r.future.set_result(None)

    def _count_step(self, rows: int) -> None:
        self.forward_batches += 1
        self.decoded_rows += rows
        if self.step_listener is not None:
            self.step_listener(rows)
