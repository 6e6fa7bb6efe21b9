"""Per-row KV-cache surgery for the embedded engine's continuous batching (engines/embedded_decode.py):
join a newly prefilled group of rows into the running batch, left-padding the shorter cache with masked
zeros, and trim the leading columns every row masks once the rows that needed them have left.

Works on transformers' DynamicCache made of plain DynamicLayer layers (full attention: Llama, Qwen2,
SmolLM2, ...). A cache with other layers (sliding windows, linear attention) is not joinable: the engine
then admits new rows only into an empty batch.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer


def joinable(cache: Any) -> bool:
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer and layer.is_initialized for layer in layers)


def left_pad(t: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    """`t` with zeros before its entries along `dim`, up to `length` entries."""
    missing = length - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def join(running: Any, mask: torch.Tensor, group: Any, group_mask: torch.Tensor) -> torch.Tensor:
    """Append `group`'s rows to `running` (in place) after left-padding both to the longer cache; returns
    the joined attention mask over the cache columns (0 on the padding)."""
    length = max(mask.shape[1], group_mask.shape[1])
    for mine, theirs in zip(running.layers, group.layers, strict=True):
        mine.keys = torch.cat([left_pad(mine.keys, length, -2), left_pad(theirs.keys, length, -2)], dim=0)
        mine.values = torch.cat(
            [left_pad(mine.values, length, -2), left_pad(theirs.values, length, -2)], dim=0
        )
    return torch.cat([left_pad(mask, length, 1), left_pad(group_mask, length, 1)], dim=0)


def trim_front(cache: Any, mask: torch.Tensor) -> torch.Tensor:
    """Drop the leading cache columns that every row masks (left by rows that have left); returns the
    trimmed mask. Positions are explicit per row, so no row's numbering changes."""
    used = mask.any(dim=0)
    if bool(used[0]):
        return mask
    first = int(used.long().argmax())  # some column is used: every row attends to its own last token
    for layer in cache.layers:
        layer.keys = layer.keys[..., first:, :]
        layer.values = layer.values[..., first:, :]
    return mask[:, first:]
