"""docs/configuration.md, generated from the config classes so that it cannot drift from them.

    python -m teamtr.training.config_doc --write     # rewrite docs/configuration.md after changing a config
    python -m teamtr.training.config_doc             # print it

Every key of a training config (training/config.py `TrainConfig` and the sections it nests: graphs/spec.py
`TaskConfig` / `TeamConfig`, training/stage.py `ScheduleConfig`, engines/open.py `VLLMSettings`)
with its type, its default and what it does: the comment written beside or above the field in its class
(or its `Field(description=...)`). tests/project/test_first_hour_traps.py fails when the file is not what this
module writes, so whoever changes a config class last regenerates it.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import json
import sys
import textwrap
import tokenize
from pathlib import Path
from typing import Any, Literal, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

DOC_PATH = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
REGENERATE = "python -m teamtr.training.config_doc --write"


@dataclasses.dataclass
class Key:
    name: str
    type: str
    default: Any
    what: str


def _class_notes(cls: type) -> dict[str, tuple[str, str]]:
    """field name -> (its annotation as written, its comment: the comment lines right above it and the one
    at the end of its line), for the fields `cls` itself defines."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    notes: dict[str, tuple[str, str]] = {}
    for node in body.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above: list[str] = []
        n = node.lineno - 1
        while n >= 1 and lines[n - 1].strip().startswith("#"):
            above.insert(0, comments[n])
            n -= 1
        end = [comments[k] for k in range(node.lineno, (node.end_lineno or node.lineno) + 1) if k in comments]
        notes[node.target.id] = (ast.unparse(node.annotation), " ".join([*above, *end]).strip())
    return notes


def _spelt_out(annotation: str, cls: type) -> str:
    """An annotation that names a Literal alias of `cls`'s module (`EngineKind`) with its values after it
    (`EngineKind: Literal['embedded', 'vllm']`), so that the reference shows what the key accepts."""
    alias = getattr(sys.modules.get(cls.__module__), annotation, None)
    return f"{annotation}: {alias}".replace("typing.", "") if get_origin(alias) is Literal else annotation


def _notes(cls: type) -> dict[str, tuple[str, str]]:
    """`_class_notes` over `cls` and the classes it inherits fields from (the nearest definition wins)."""
    out: dict[str, tuple[str, str]] = {}
    for base in reversed(cls.__mro__):
        if base.__module__.startswith("teamtr."):
            notes = _class_notes(base)
            out.update(
                {name: (_spelt_out(annotation, base), what) for name, (annotation, what) in notes.items()}
            )
    return out


def _constraints(metadata: list[Any]) -> str:
    signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    parts = [f"{sign} {getattr(m, k)}" for m in metadata for k, sign in signs.items() if hasattr(m, k)]
    return f" ({', '.join(parts)})" if parts else ""


def section_keys(cls: type) -> list[Key]:
    """The keys of one config class (a pydantic model or a dataclass), in the order it defines them."""
    notes = _notes(cls)
    keys: list[Key] = []
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        for name, info in cls.model_fields.items():
            annotation, what = notes.get(name, (str(info.annotation), ""))
            if info.default_factory is not None:
                default = info.default_factory()  # type: ignore[call-arg]
            else:
                default = None if info.default is PydanticUndefined else info.default
            what = info.description or what
            keys.append(Key(name, annotation + _constraints(info.metadata), default, what))
    else:
        for f in dataclasses.fields(cls):
            annotation, what = notes.get(f.name, (str(f.type), ""))
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
            keys.append(Key(f.name, annotation, default, what))
    return keys


# What a field does where its class has no comment beside or above it (keyed by its dotted path;
# tests/project/test_first_hour_traps.py checks that every entry is still a key). Better: a comment in the class.
NOTES = {
    "seed": "seeds everything random in the run (LoRA initialisation, rollouts, order, evaluation episodes): "
    "a run killed and resumed ends with the same adapters",
    "stages": "how many stages of Algorithm 1 (each updates every role once, in order sigma)",
    "run_dir": "the run directory: config.yaml, metrics.jsonl, tensorboard/, adapters/<adapter>/v<N>/, the "
    "resume checkpoint; `teamtr train --run-dir` overrides it",
    "torch_threads": "torch CPU threads of the trainer and its embedded engine",
    "schedule.kind": "teamtr = Algorithm 1 (fresh rollouts of the intermediate team before each update); "
    "naive = every update on the stage-start batch; joint = one update of the whole team on the stage-start "
    "batch (one objective over the team's trajectory ratios, every adapter moved by each step: "
    "training/joint_step.py); "
    "importance_weighting = the stage-start batch reweighted towards pi^(i-1)",
    "loss.kind": "the surrogate and advantage estimator: message_ratio (TeamTR's), ppo_batch_baseline, grpo, "
    "dapo (the class docstring above)",
    "optim.lr": "learning rate of each adapter's optimiser",
    "optim.minibatch_messages": "messages per optimiser step",
    "optim.max_grad_norm": "gradient norm clip per optimiser step",
    "optim.weight_decay": "decoupled weight decay",
    "trust_region.delta": "delta: the bound on d_hat, the KL between an update's policy before and after",
    "trust_region.penalty": "the KL penalty beta * d_hat in the loss: adaptive (see above), fixed at "
    "beta_init, or none",
    "trust_region.beta_init": "beta of a role's first update",
    "trust_region.beta_factor": "adaptive penalty: beta's factor up or down",
    "trust_region.beta_min": "adaptive penalty: beta's floor",
    "trust_region.beta_max": "adaptive penalty: beta's ceiling",
    "trust_region.early_stop": "stop the inner epochs as soon as d_hat exceeds delta",
    "certificate.gamma": "gamma of the certificate's constant c (a diagnostic: it does not change training)",
    "team.role_bases": "which base each role's adapter sits on: role -> a name in `bases` (or `base`)",
    "team.lora_rank": "LoRA rank r of every role's adapter",
    "team.lora_alpha": "LoRA alpha (scale alpha / r)",
    "team.dtype": "the base models' dtype on the embedded engine; auto = bfloat16 on a GPU, else float32",
    "rollout.vllm_replicas": "vLLM servers launched per base (see `vllm_urls`)",
    "rollout.vllm_tensor_parallel_size": "GPUs per launched vLLM server, tensor parallel",
    "rollout.vllm_pipeline_parallel_size": "GPUs per launched vLLM server, pipeline parallel",
}
UNDOCUMENTED = "(no comment in its class yet: add one beside the field)"


def _is_section(value: Any) -> bool:
    return isinstance(value, BaseModel) or dataclasses.is_dataclass(value)


def _show(value: Any) -> str:
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    return f"`{json.dumps(value)}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _doc(cls: type) -> str:
    """The class docstring: its first paragraph as text, the rest (aligned lists) as written."""
    first, _, rest = inspect.cleandoc(cls.__doc__ or "").partition("\n\n")
    return f"{first}\n\n```text\n{rest}\n```" if rest else first


def _table(prefix: str, keys: list[Key]) -> list[str]:
    rows = ["| key | type | default | what it does |", "|---|---|---|---|"]
    for k in keys:
        what = k.what or NOTES.get(prefix + k.name, UNDOCUMENTED)
        rows.append(f"| `{prefix}{k.name}` | {_cell(k.type)} | {_cell(_show(k.default))} | {_cell(what)} |")
    return rows


def all_keys() -> list[str]:
    """Every dotted key of a training config (section keys as `section.key`)."""
    from teamtr.training.config import TrainConfig

    out = []
    for k in section_keys(TrainConfig):
        if _is_section(k.default):
            out += [f"{k.name}.{sub.name}" for sub in section_keys(type(k.default))]
        else:
            out.append(k.name)
    return out


def config_reference() -> str:
    """The text of docs/configuration.md."""
    from teamtr.training.config import TrainConfig

    top = section_keys(TrainConfig)
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated from the config classes by `" + REGENERATE + "`: do not edit by",
        "hand. Whoever changes a config class runs that command (tests/project/test_first_hour_traps.py fails until",
        "this file is what it writes). -->",
        "",
        f"**Regenerate:** `{REGENERATE}` (from the repository root, in the venv).",
        "",
        "Every key of a `teamtr train` config, its default and what it does. A YAML file names only what it",
        "changes; an unknown key is an error. Any key can also be set on the command line:",
        "`teamtr train CONFIG --set optim.lr=1e-4 --set rollout.temperature=0.5`. The comments below are the",
        "ones written beside each field in its class (training/config.py, graphs/spec.py, training/stage.py,",
        "engines/open.py); docs/training.md explains the algorithm they configure and",
        "docs/graphs.md a user's own graph.",
        "",
        f"## The run (top level)\n\n{_doc(TrainConfig)}",
        "",
        *_table("", [k for k in top if not _is_section(k.default)]),
    ]
    for k in top:
        if not _is_section(k.default):
            continue
        cls = type(k.default)
        out += [
            "",
            f"## `{k.name}` ({cls.__name__})",
            "",
            _doc(cls),
            "",
            *_table(f"{k.name}.", section_keys(cls)),
        ]
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    text = config_reference()
    if "--write" in argv:
        DOC_PATH.write_text(text)
        print(f"wrote {DOC_PATH}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
