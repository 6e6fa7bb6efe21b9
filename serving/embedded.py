"""The embedded engine: transformers + peft in this process, no server.

One or more base models, each with one LoRA adapter per role (peft named adapters) and the
adapter-disabled reference. Many episodes run concurrently (asyncio): their pending `generate` calls are
gathered into one batched forward pass per decoding step, each row with its own adapter (peft's mixed
adapter batches), its own sampling settings and its own seeded random generator.

Batch composition is deterministic: a batch is formed when the event loop has gone quiet (every episode
in flight is waiting on the engine or finished), so a seeded run samples the same tokens every time.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedModel, PreTrainedTokenizerFast

from teamtr.graphs.engine import DEFAULT_BASE, LORA_TARGET_MODULES, Generation, SamplingParams
from teamtr.serving.devices import DtypeSpec, resolve_device, resolve_dtype
from teamtr.serving.models import ModelReferenceError, resolve_model

BASE_ADAPTER = "__base__"  # peft's name for "no adapter" in a mixed-adapter batch


@dataclass
class LoraSettings:
    """LoRA adapters the engine creates for roles (loaded adapters keep their own config)."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: tuple[str, ...] = LORA_TARGET_MODULES

    def peft_config(self) -> LoraConfig:
        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=list(self.target_modules),
            task_type="CAUSAL_LM",
        )


@dataclass
class _Request:
    prompt_ids: list[int]
    adapter: str | None
    sampling: SamplingParams
    future: asyncio.Future
    # filled while decoding
    completion: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """The fast tokenizer saved beside the model, never AutoTokenizer's guess (docs/serving.md, "The code")."""
    tok = PreTrainedTokenizerFast.from_pretrained(str(path))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def set_torch_threads(threads: int | None) -> None:
    threads = threads or int(os.environ.get("TEAMTR_TORCH_THREADS", "0") or 0)
    if threads > 0:
        torch.set_num_threads(threads)


def eos_token_ids(path: str, tokenizer: PreTrainedTokenizerFast, model: PreTrainedModel) -> frozenset[int]:
    """Every id that ends a message: the tokenizer's EOS and each EOS the generation config lists (chat
    models often end a turn with a token other than the tokenizer's EOS, e.g. <|eot_id|> in Llama 3)."""
    ids = {tokenizer.eos_token_id}
    try:
        configured = GenerationConfig.from_pretrained(path).eos_token_id
    except (OSError, ValueError):  # no generation_config.json: the model config's own
        configured = getattr(model.generation_config, "eos_token_id", None)
    ids.update(configured if isinstance(configured, list | tuple) else [configured])
    return frozenset(i for i in ids if i is not None)


class _Base:
    """One base model with its tokenizer, its peft wrapper (once it has adapters) and adapter versions."""

    def __init__(self, reference: str | Path, dtype: torch.dtype, device: torch.device) -> None:
        self.reference = str(reference)
        self.path = resolve_model(reference, progress=True).path  # a folder, a hub id, or a prepared GGUF
        try:
            self.model: PreTrainedModel | PeftModel = AutoModelForCausalLM.from_pretrained(self.path, dtype=dtype)
            self.tokenizer = load_tokenizer(self.path)
        except (OSError, ValueError) as e:  # a hub id not on the hub / no hub reachable, a folder without weights
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ModelReferenceError(
                f"model {self.reference!r} could not be loaded ({reason}); give a local Hugging Face folder, "
                "a .gguf file, or a hub id reachable from this machine"
            ) from e
        self.model.to(device)
        self.model.eval()
        self.device = device
        self.eos_ids = eos_token_ids(self.path, self.tokenizer, self.model)
        self.versions: dict[str, int] = {}
        self.pieces: dict[int, str] = {}
        # transformers >= 5.2x calls the KV cache `cache`; earlier releases `past_key_values`
        forward_args = inspect.signature(type(self.model).forward).parameters
        self.cache_kwarg = "cache" if "cache" in forward_args else "past_key_values"

    @property
    def peft(self) -> PeftModel | None:
        return self.model if isinstance(self.model, PeftModel) else None

    def adapter_names(self) -> list[str]:
        return list(self.versions)


class EmbeddedEngine:
    """Implements the `Engine` protocol (graphs/engine.py) in process."""

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
        folder, a hub id, or a .gguf file (converted once into a cached folder; serving/models.py).
        `adapters`: adapter name -> peft adapter dir to load, or None to create a fresh LoRA adapter
        (B = 0, so it starts equal to the base) on the default base.
        `device`: auto | cpu | cuda | cuda:K; `dtype`: auto | float32 | bfloat16 | float16 (or a torch
        dtype). auto = the first GPU in bfloat16 when torch sees one, else the CPU in float32
        (serving/devices.py); a GPU asked for where there is none fails here, before any model loads.
        `decode_in_thread`: decode in a worker thread so requests arriving mid-decode join the next batch
        (serving); batch composition then depends on timing, so seeded runs are no longer bit-identical.
        Off by default: training rollouts want reproducible batches."""
        set_torch_threads(threads)
        if not isinstance(bases, dict):
            bases = {DEFAULT_BASE: bases}
        if not bases:
            raise ValueError("an engine needs at least one base model")
        models = ", ".join(str(p) for p in bases.values())
        self.device = resolve_device(device, model=models)
        self.dtype = resolve_dtype(dtype, self.device)
        self._bases = {name: _Base(path, self.dtype, self.device) for name, path in bases.items()}
        self.lora = lora or LoraSettings()
        self.max_batch = max_batch
        self.decode_in_thread = decode_in_thread
        self._locks: dict[str, asyncio.Lock] = {}  # per base: decoding vs adapter load/unload
        self._pending: dict[str, list[_Request]] = {b: [] for b in self._bases}
        self._workers: dict[str, asyncio.Task] = {}
        self.forward_batches = 0  # decoding forward passes run (a batched step counts once)
        self.decode_batches = 0  # batches of generate calls decoded together
        self.generate_calls = 0
        for name, path in (adapters or {}).items():
            if path is None:
                self.add_adapter(name)
            else:
                self.load_adapter_sync(name, path)

    # ---- models, tokenizers, adapters ---------------------------------------------------------------

    def _base(self, base: str) -> _Base:
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

    def adapters(self, base: str = DEFAULT_BASE) -> list[str]:
        return self._base(base).adapter_names()

    def adapter_version(self, adapter: str | None, base: str = DEFAULT_BASE) -> int:
        if adapter is None:
            return 0
        b = self._base(base)
        if adapter not in b.versions:
            raise KeyError(f"unknown adapter {adapter!r} on base {base!r}; have {b.adapter_names()}")
        return b.versions[adapter]

    def add_adapter(self, name: str, base: str = DEFAULT_BASE, config: LoraConfig | None = None) -> None:
        """A fresh LoRA adapter (peft init: B = 0, so it starts exactly equal to the base)."""
        b = self._base(base)
        if name in b.versions:
            raise ValueError(f"adapter {name!r} already exists on base {base!r}")
        config = config or self.lora.peft_config()
        if b.peft is None:
            b.model = get_peft_model(b.model, config, adapter_name=name)
        else:
            b.peft.add_adapter(name, config)
        b.model.eval()
        b.versions[name] = 0

    def load_adapter_sync(self, name: str, path: str | Path, base: str = DEFAULT_BASE) -> None:
        """Load a peft adapter dir under `name` (replacing an adapter of that name); bumps its version."""
        b = self._base(base)
        path = str(path)
        if b.peft is None:
            b.model = PeftModel.from_pretrained(b.model, path, adapter_name=name, is_trainable=False)
        else:
            if name in b.versions:
                b.peft.delete_adapter(name)
            b.peft.load_adapter(path, adapter_name=name, is_trainable=False)
        b.model.eval()
        b.versions[name] = b.versions.get(name, -1) + 1

    def _lock(self, base: str) -> asyncio.Lock:
        lock = self._locks.get(base)
        if lock is None:
            lock = self._locks[base] = asyncio.Lock()
        return lock

    async def load_adapter(self, name: str, path: str, base: str = DEFAULT_BASE) -> None:
        async with self._lock(base):  # never change the model under a decode running in a thread
            self.load_adapter_sync(name, path, base)

    async def unload_adapter(self, name: str, base: str = DEFAULT_BASE) -> None:
        async with self._lock(base):
            b = self._base(base)
            if name not in b.versions:
                raise KeyError(f"unknown adapter {name!r}")
            b.peft.delete_adapter(name)
            del b.versions[name]

    def save_adapter(self, name: str, out_dir: str | Path, base: str = DEFAULT_BASE) -> Path:
        """peft's standard format (adapter_config.json + adapter_model.safetensors) in `out_dir`."""
        b = self._base(base)
        self.adapter_version(name, base)
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        b.peft.save_pretrained(str(out), selected_adapters=[name], safe_serialization=True)
        nested = out / name  # peft nests non-default adapters in dir/NAME/
        if nested.is_dir():
            for f in nested.iterdir():
                f.replace(out / f.name)
            nested.rmdir()
        return out

    def adapter_parameters(self, name: str, base: str = DEFAULT_BASE) -> dict[str, torch.nn.Parameter]:
        """The LoRA parameters of one adapter (what the trainer optimises for that role)."""
        self.adapter_version(name, base)
        suffix = f".{name}.weight"
        return {k: p for k, p in self.model(base).named_parameters() if k.endswith(suffix) and "lora_" in k}

    def snapshot_adapter(self, name: str, base: str = DEFAULT_BASE) -> dict[str, torch.Tensor]:
        return {k: p.detach().clone() for k, p in self.adapter_parameters(name, base).items()}

    @torch.no_grad()
    def restore_adapter(self, name: str, snapshot: dict[str, torch.Tensor], base: str = DEFAULT_BASE) -> None:
        """Put exactly these weights back (backtracking a rejected update)."""
        params = self.adapter_parameters(name, base)
        if set(params) != set(snapshot):
            raise ValueError(f"snapshot does not match adapter {name!r}")
        for k, p in params.items():
            p.copy_(snapshot[k])

    def commit_adapter_update(self, name: str, base: str = DEFAULT_BASE) -> int:
        """Mark new weights of `name` as live: the next rollouts record the new version."""
        b = self._base(base)
        self.adapter_version(name, base)
        b.versions[name] += 1
        return b.versions[name]

    # ---- scoring ------------------------------------------------------------------------------------

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
        if temperature <= 0:
            raise ValueError("token_logprobs needs a temperature > 0 (greedy has no log-probs to score)")
        if len(prompts) != len(completions):
            raise ValueError("prompts and completions differ in length")
        if not prompts:
            return []
        b = self._base(base)
        pad = b.tokenizer.pad_token_id
        seqs = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):  # right padding: positions are plain 0..len-1
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
        adapters = adapter if isinstance(adapter, list) else [adapter] * len(seqs)
        with self._adapters_for(b, adapters) as kwargs:
            logits = b.model(input_ids=ids.to(b.device), attention_mask=mask.to(b.device), **kwargs).logits.float()
        if temperature != 1.0:
            logits = logits / temperature
        logp = torch.log_softmax(logits[:, :-1], dim=-1)
        out = []
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
            pos = torch.arange(len(p) - 1, len(p) - 1 + len(c), device=b.device)
            out.append(logp[i, pos, torch.tensor(c, dtype=torch.long, device=b.device)])
        return out

    @torch.no_grad()
    def score(
        self,
        prompts: list[list[int]],
        completions: list[list[int]],
        adapter: str | None,
        base: str = DEFAULT_BASE,
    ) -> list[list[float]]:
        return [t.tolist() for t in self.token_logprobs(prompts, completions, adapter, base)]

    @contextmanager
    def _adapters_for(self, b: _Base, adapters: list[str | None]) -> Iterator[dict]:
        """Forward kwargs that give each row its own adapter (None = the base / reference)."""
        for a in adapters:
            if a is not None and a not in b.versions:
                raise KeyError(f"unknown adapter {a!r}; have {b.adapter_names()}")
        if b.peft is None:
            yield {}
        elif all(a is None for a in adapters):
            with b.peft.disable_adapter():
                yield {}
        elif len(set(adapters)) == 1:
            b.peft.set_adapter(adapters[0])  # one adapter: plain forward, no per-row dispatch
            yield {}
        else:
            yield {"adapter_names": [BASE_ADAPTER if a is None else a for a in adapters]}

    # ---- generation ---------------------------------------------------------------------------------

    async def generate(
        self,
        prompt_ids: list[int],
        *,
        adapter: str | None,
        sampling: SamplingParams,
        base: str = DEFAULT_BASE,
    ) -> Generation:
        b = self._base(base)
        if not prompt_ids:
            raise ValueError("empty prompt")
        version = self.adapter_version(adapter, base)
        loop = asyncio.get_running_loop()
        req = _Request(list(prompt_ids), adapter, sampling, loop.create_future())
        self._pending[base].append(req)
        self.generate_calls += 1
        worker = self._workers.get(base)
        if worker is None or worker.done() or worker.get_loop() is not loop:
            self._workers[base] = loop.create_task(self._worker(base))
        await req.future
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

    async def _worker(self, base: str) -> None:
        """Gather pending calls until the event loop is quiet, then decode them as one batch."""
        pending = self._pending[base]
        while pending:
            seen, quiet = -1, 0
            while quiet < 16 and len(pending) < self.max_batch:  # every episode in flight has had its say
                await asyncio.sleep(0)
                quiet = quiet + 1 if len(pending) == seen else 0
                seen = len(pending)
            batch, pending[:] = pending[: self.max_batch], pending[self.max_batch :]
            try:
                if self.decode_in_thread:
                    async with self._lock(base):
                        await asyncio.to_thread(self._decode, self._base(base), batch)
                else:
                    self._decode(self._base(base), batch)
            except Exception as e:  # fail the callers, keep the engine alive
                for r in batch:
                    if not r.future.done():
                        r.future.set_exception(e)
                continue
            for r in batch:
                if not r.future.done():
                    r.future.set_result(None)

    @torch.no_grad()
    def _decode(self, b: _Base, batch: list[_Request]) -> None:
        """Batched sampling with a KV cache; rows are left-padded, each row keeps its own settings."""
        tok = b.tokenizer
        n = len(batch)
        self.decode_batches += 1
        width = max(len(r.prompt_ids) for r in batch)
        ids = torch.full((n, width), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, r in enumerate(batch):
            ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            mask[i, width - len(r.prompt_ids) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        ids, mask, positions = ids.to(b.device), mask.to(b.device), positions.to(b.device)
        gens = [_row_generator(r.sampling.seed) for r in batch]
        temps = torch.tensor([r.sampling.temperature for r in batch], device=b.device)
        top_ps = torch.tensor([r.sampling.top_p for r in batch], device=b.device)
        limits = [r.sampling.max_new_tokens for r in batch]
        texts = [""] * n  # decoded so far, for stop strings
        done = [False] * n
        eos = b.eos_ids
        past = None
        step_ids, step_pos = ids, positions
        with self._adapters_for(b, [r.adapter for r in batch]) as kwargs:
            for _ in range(max(limits)):
                out = b.model(
                    input_ids=step_ids,
                    attention_mask=mask,
                    position_ids=step_pos,
                    use_cache=True,
                    logits_to_keep=1,
                    **{b.cache_kwarg: past},
                    **kwargs,
                )
                self.forward_batches += 1
                past = out["cache"] if "cache" in out else out["past_key_values"]
                logits = out.logits[:, -1].float()
                # log-probs of the distribution each row sampled from (SamplingParams says which)
                next_tokens, logp = _sample_rows(logits, temps, top_ps, gens)
                chosen = logp.gather(1, next_tokens[:, None])[:, 0].tolist()
                for i, (r, t) in enumerate(zip(batch, next_tokens.tolist(), strict=True)):
                    if done[i]:
                        next_tokens[i] = tok.pad_token_id
                        continue
                    r.completion.append(t)
                    r.logprobs.append(chosen[i])
                    if t in eos:
                        done[i], r.finish_reason = True, "stop"
                    elif r.sampling.stop and _hits_stop(texts, i, self._piece(b, t), r.sampling.stop):
                        done[i], r.finish_reason = True, "stop"
                    elif len(r.completion) >= limits[i]:
                        done[i], r.finish_reason = True, "length"
                if all(done):
                    break
                step_ids = next_tokens[:, None]
                step_pos = step_pos[:, -1:] + 1
                mask = torch.cat([mask, torch.ones((n, 1), dtype=torch.long, device=b.device)], dim=1)

    def _piece(self, b: _Base, token: int) -> str:
        """Decoded text of one token, cached (stop strings are checked on every sampled token)."""
        piece = b.pieces.get(token)
        if piece is None:
            piece = b.pieces[token] = b.tokenizer.decode([token], skip_special_tokens=True)
        return piece


def _row_generator(seed: int | None) -> torch.Generator | None:
    if seed is None:
        return None
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def _hits_stop(texts: list[str], i: int, piece: str, stops: tuple[str, ...]) -> bool:
    texts[i] += piece
    tail = texts[i][-(max(map(len, stops)) + len(piece)) :]
    return any(s in tail for s in stops)


def _sample_rows(
    logits: torch.Tensor, temps: torch.Tensor, top_ps: torch.Tensor, gens: list[torch.Generator | None]
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row: greedy where T = 0, else temperature + nucleus sampling by the Gumbel-max trick,
    with each row's noise drawn from its own seeded generator (so a row's sample does not depend on the
    other rows of the batch).

    Also returns [rows, V] log-probs of the distribution each row sampled from: log softmax(logits / T),
    -inf outside the nucleus and renormalised over it when top_p < 1; for greedy rows (a degenerate
    distribution) the log-probs of the untempered policy, log softmax(logits)."""
    greedy = temps == 0
    scaled = logits / torch.where(greedy, 1.0, temps)[:, None]
    if bool((top_ps < 1).any()):  # nucleus: keep the smallest set of tokens whose mass reaches top_p
        probs = torch.softmax(scaled, dim=-1)
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        drop_sorted = sorted_p.cumsum(-1) - sorted_p >= top_ps[:, None]
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        scaled = scaled.masked_fill(drop & ~greedy[:, None], float("-inf"))
    # noise drawn on the CPU from each row's generator, whatever the device: a seed samples the same tokens
    u = torch.stack([torch.rand(logits.shape[1], generator=g) for g in gens]).to(logits.device)
    gumbel = -torch.log(-torch.log(u.clamp_min(1e-20)))
    sampled = torch.argmax(scaled + gumbel, dim=-1)
    tokens = torch.where(greedy, torch.argmax(logits, dim=-1), sampled)
    return tokens, torch.log_softmax(scaled, dim=-1)  # greedy rows: scaled is the untempered logits
