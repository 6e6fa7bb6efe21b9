"""What graph code a run trained with: a digest of each module its config names (team.graph, roles, input,
output, reward, router), recorded in RUN_DIR/code_digest.json when the run starts, so that serving the run
with edited code (new prompts on the old adapters) is said out loud instead of served silently.

    record_code_digest(run_path, team_cfg)      # training/run_dir.py RunDir.create
    changed_code(run_path, team_cfg)            # `teamtr serve RUN_DIR`: a warning line per changed module
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from teamtr.graphs.loading import import_module

CODE_DIGEST_FILE = "code_digest.json"
CODE_KEYS = ("graph", "roles", "input", "output", "reward", "router")


def named_modules(team_cfg: Any) -> list[str]:
    """The modules of the config's `module:attribute` keys (team.graph, roles, ...), each once."""
    names = [getattr(team_cfg, key, None) for key in CODE_KEYS]
    return list(dict.fromkeys(spec.partition(":")[0] for spec in names if spec))


def code_digests(team_cfg: Any) -> dict[str, dict[str, str]]:
    """module -> {file, sha256} of its source file, for every module the config names that has one."""
    out = {}
    for name in named_modules(team_cfg):
        try:
            path = getattr(import_module(name), "__file__", None)
        except ImportError:
            continue
        if path and Path(path).is_file():
            out[name] = {
                "file": str(Path(path).resolve()),
                "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest(),
            }
    return out


def record_code_digest(run_path: Path, team_cfg: Any) -> None:
    """Write RUN_DIR/code_digest.json (once: a resumed run keeps the digest it started with)."""
    path = Path(run_path) / CODE_DIGEST_FILE
    if not path.exists() and (digests := code_digests(team_cfg)):
        path.write_text(json.dumps(digests, indent=2) + "\n")


def changed_code(run_path: Path, team_cfg: Any) -> list[str]:
    """One line per module whose source differs from (or is gone since) what the run recorded; [] when the
    code is the same or the run recorded none (a run made before the digest)."""
    path = Path(run_path) / CODE_DIGEST_FILE
    if not path.is_file():
        return []
    recorded = json.loads(path.read_text())
    now = code_digests(team_cfg)
    lines = []
    for name, was in recorded.items():
        if name not in now:
            lines.append(f"module {name} ({was['file']}) is not importable now")
        elif now[name]["sha256"] != was["sha256"]:
            lines.append(f"module {name} ({now[name]['file']}) changed since the run trained with it")
    return lines
