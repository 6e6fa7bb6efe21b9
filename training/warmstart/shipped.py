"""Warm-started models shipped inside the package, so that a figure made from one (the demo's) starts from
the same weights on every machine.

A build is deterministic on one machine only: its hundreds of supervised steps from scratch, and the
choice of the best noisy checkpoint, turn the last-bit rounding of the CPU's code path (AVX2, AVX-512,
AMX; MKL's) into different weights (docs/evals.md, "Deterministic warm starts"). Fixed weights, by contrast,
evaluate and train identically across those code paths. So the demo's warm model is built once and
shipped: `training/warmstart/shipped/<name>/` holds it with its build report, and `shipped.json` the
sha256 of its weights. `ensure_warm_model` returns the shipped model of a config when there is one (same
cache key), checked against that digest; a build of the same config elsewhere that gives other weights
warns that figures made from it will differ from the documented ones.

`teamtr warmstart ship --write NAME` (cli/warmstart.py) builds the demo's warm config (or
`--stop-accuracy`/`--seed` variants) and ships the result under NAME, replacing what was shipped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import platform
import shutil
import tempfile
from pathlib import Path

from teamtr.training.warmstart.config import WarmStartConfig

log = logging.getLogger(__name__)

SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"
MANIFEST = SHIPPED_DIR / "shipped.json"
WEIGHTS_FILE = "model.safetensors"
# the demo's warm start (training/demo.py DEMO_CONFIG `team.warm_start`), the one model shipped now
DEMO_WARM_OVERRIDES: dict = {"stop_accuracy": 0.45}


class ShippedModelError(RuntimeError):
    """A shipped model whose files do not match the digests recorded for them (a damaged install)."""


def weights_digest(model_dir: str | Path) -> str | None:
    """sha256 of a model folder's weights (model.safetensors), None when it has none (a hub name)."""
    from teamtr.training.warmstart.report import sha256

    path = Path(model_dir) / WEIGHTS_FILE
    return sha256(path) if path.is_file() else None


def build_environment() -> dict:
    """What decides a build's last bits besides its config: the CPU code path torch dispatches to and the
    versions of the libraries doing the arithmetic (recorded in every build report)."""
    import numpy
    import safetensors
    import tokenizers
    import torch
    import transformers

    return {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "safetensors": safetensors.__version__,
        "numpy": numpy.__version__,
        "mkl": torch.backends.mkl.is_available(),
    }


def _manifest() -> dict:
    return json.loads(MANIFEST.read_text()) if MANIFEST.is_file() else {"models": {}}


def shipped_entry(cfg: WarmStartConfig) -> tuple[str, dict] | None:
    """(name, manifest entry) of the model shipped for `cfg` (matched by cache key), else None."""
    key = cfg.cache_key()
    for name, entry in _manifest()["models"].items():
        if entry["cache_key"] == key:
            return name, entry
    return None


def shipped_model(cfg: WarmStartConfig) -> Path | None:
    """The shipped model folder for `cfg`, its files checked against their recorded digests; None when
    nothing is shipped for this config."""
    from teamtr.training.warmstart.report import sha256

    found = shipped_entry(cfg)
    if found is None:
        return None
    name, entry = found
    path = SHIPPED_DIR / name
    for file, digest in entry["files"].items():
        if not (path / file).is_file() or sha256(path / file) != digest:
            raise ShippedModelError(
                f"{path / file} does not match its sha256 in {MANIFEST} (a damaged install?): reinstall "
                f"teamtr, or build the model with `teamtr warmstart --out DIR`"
            )
    return path


def warn_if_not_shipped(cfg: WarmStartConfig, model_dir: Path) -> str | None:
    """After a build: a warning (logged and returned) when a model is shipped for the same config and
    this build's weights differ from it, i.e. figures made from this build will not be the documented
    ones; None when they agree or nothing is shipped."""
    found = shipped_entry(cfg)
    if found is None:
        return None
    name, entry = found
    digest = weights_digest(model_dir)
    if digest == entry["weights_sha256"]:
        return None
    message = (
        f"this build of {name}'s config has weights sha256 {str(digest)[:12]}, the shipped one "
        f"{entry['weights_sha256'][:12]} (built on {entry['environment'].get('cpu_capability')}, here "
        f"{build_environment()['cpu_capability']}): figures made from this build will differ from the "
        f"documented ones, which start from the shipped model"
    )
    log.warning(message)
    return message


def write_shipped(cfg: WarmStartConfig, name: str, progress: bool = True) -> dict:
    """Build `cfg`'s model and ship it as `name` (replacing a model shipped under that name or for that
    config); returns its manifest entry. Commit the folder and shipped.json, then re-measure the
    figures that start from it (README, docs/training.md)."""
    from teamtr.training.warmstart.build import build_warm_model

    with tempfile.TemporaryDirectory() as tmp:
        build_warm_model(cfg, Path(tmp) / "build", progress=progress)
        return ship_folder(Path(tmp) / "build", name)


def ship_folder(build_dir: Path, name: str) -> dict:
    """Copy a finished build folder into the package as `name` and record it in shipped.json."""
    from teamtr.training.warmstart.report import (
        CURVE_FILE,
        HISTORY_FILE,
        REPORT_FILE,
        load_report,
        sha256,
        write_report,
    )

    report = load_report(build_dir)
    cfg = WarmStartConfig(**{**report.config, "band": tuple(report.config["band"])})
    dest = SHIPPED_DIR / name
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    left_out = {HISTORY_FILE, CURVE_FILE, REPORT_FILE}
    for file in sorted(p for p in build_dir.iterdir() if p.is_file() and p.name not in left_out):
        shutil.copy2(file, dest / file.name)
    files = {p.name: sha256(p) for p in sorted(dest.iterdir())}
    report.path = f"teamtr/training/warmstart/shipped/{name}"
    report.files = files  # what the cache's is_complete checks: the shipped files only
    write_report(report, dest)
    entry = {
        "cache_key": cfg.cache_key(),
        "overrides": {
            k: v for k, v in dataclasses.asdict(cfg).items() if v != getattr(WarmStartConfig(), k, v)
        },
        "weights_sha256": files[WEIGHTS_FILE],
        "files": files,
        "environment": report.environment,
        "greedy_team_accuracy": report.greedy.team_accuracy,
    }
    manifest = _manifest()
    manifest["models"] = {n: e for n, e in manifest["models"].items() if e["cache_key"] != entry["cache_key"]}
    manifest["models"][name] = entry
    SHIPPED_DIR.mkdir(parents=True, exist_ok=True)
    MANIFEST.write_text(json.dumps(manifest, indent=1, default=list) + "\n")
    return entry
