"""Device and dtype settings of engines that load a model: `auto | cpu | cuda[:k]` and
`auto | float32 | bfloat16 | float16`, checked before any weights are loaded.

auto picks CUDA (device 0) with bfloat16 when torch sees a GPU (float16 where the GPU has no bf16),
else the CPU with float32 (what the exact log-prob tests and the tiny models assume).
"""

from __future__ import annotations

import re
from typing import Literal

import torch

DeviceSpec = str  # "auto", "cpu", "cuda", "cuda:K"
DtypeSpec = Literal["auto", "float32", "bfloat16", "float16"]
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


class DeviceError(ValueError):
    """A device or dtype that does not exist on this machine; the message says what to use instead."""


def resolve_device(spec: DeviceSpec | torch.device = "auto", *, model: str = "") -> torch.device:
    """The torch device for `spec`; DeviceError for CUDA where torch sees none (or not that many)."""
    if isinstance(spec, torch.device):
        spec = str(spec)
    spec = str(spec).strip().lower()
    about = f" for model {model!r}" if model else ""
    if not _DEVICE.match(spec):
        raise DeviceError(f"device {spec!r}{about}: use auto, cpu, cuda or cuda:K")
    if spec == "auto":
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if spec == "cpu":
        return torch.device("cpu")
    index = int(spec.split(":")[1]) if ":" in spec else 0
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}, no GPU visible"
        raise DeviceError(
            f"device {spec!r}{about}: torch {torch.__version__} ({build}) sees no CUDA device; "
            "use device: cpu (or auto)"
        )
    count = torch.cuda.device_count()
    if index >= count:
        raise DeviceError(f"device {spec!r}{about}: torch sees {count} CUDA device(s) (cuda:0..cuda:{count - 1})")
    return torch.device("cuda", index)


def resolve_dtype(spec: DtypeSpec | str | torch.dtype = "auto", device: torch.device | None = None) -> torch.dtype:
    """The torch dtype for `spec` on `device`: auto = bfloat16 on a GPU that has it, float16 on one that
    does not, float32 on the CPU."""
    if isinstance(spec, torch.dtype):
        if spec not in DTYPES.values():
            raise DeviceError(f"dtype {spec}: use one of {', '.join(DTYPES)}")
        return spec
    spec = str(spec).strip().lower()
    if spec == "auto":
        if device is not None and device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if spec not in DTYPES:
        raise DeviceError(f"dtype {spec!r}: use auto, {', '.join(DTYPES)}")
    return DTYPES[spec]
