"""The cache of warm-started models: `~/.cache/teamtr/models/<task>-warm-<cache key>` (or under
`$TEAMTR_CACHE`), built on first use, safe when several processes ask at once."""

from __future__ import annotations

import fcntl
import json
import shutil
import tempfile
from pathlib import Path

from teamtr.engines.models import cache_root
from teamtr.training.warmstart.build import build_warm_model
from teamtr.training.warmstart.config import WarmStartConfig
from teamtr.training.warmstart.report import REPORT_FILE, load_report, sha256, write_report
from teamtr.training.warmstart.shipped import shipped_model


def is_complete(path: Path) -> bool:
    """A cached build is complete when its report exists and every file matches the hash it recorded."""
    try:
        files = json.loads((path / REPORT_FILE).read_text())["files"]
        return bool(files) and all(sha256(path / name) == digest for name, digest in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def ensure_warm_model(cfg: WarmStartConfig | None = None, progress: bool = True, build: bool = False) -> Path:
    """The model shipped in the package for `cfg` (the same weights on every machine: shipped.py), else
    the cached warm-started model for `cfg` (built on first use, rebuilt when missing or damaged);
    `build=True` builds (or reuses the cached build) even when a model is shipped.

    A lock file makes later processes wait for the first build, and a build is written to a temporary
    folder that is renamed into place only when complete.
    """
    cfg = cfg or WarmStartConfig()
    shipped = None if build else shipped_model(cfg)
    if shipped is not None:
        return shipped
    root = cache_root() / "models"
    final = root / f"{cfg.task}-warm-{cfg.cache_key()}"
    if is_complete(final):
        return final
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if is_complete(final):  # another process built it while we waited
            return final
        if final.exists():  # partial or corrupt: move aside atomically, then delete
            trash = Path(tempfile.mkdtemp(prefix=f".{final.name}.trash-", dir=root))
            final.rename(trash / "old")
            shutil.rmtree(trash, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.build-", dir=root))
        try:
            build_warm_model(cfg, tmp, progress=progress)
            report = load_report(tmp)
            report.path = str(final)
            write_report(report, tmp)  # the report is not among the hashed files
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final
