"""Data-parallel TeamTR updates over torch.distributed ranks (`torchrun --nproc-per-node K -m teamtr.cli
train CONFIG`, or `teamtr train --nproc K`): the same run as one process, its update split over K ranks.

What each rank does (docs/scale.md):
- rollouts, the held-out evaluations and everything written to the run directory (adapters,
  metrics.jsonl, checkpoints) happen on rank 0; the episodes are broadcast, so every rank optimises on
  the batch the single-process run sees (`on_main`);
- the expensive part of the per-agent step, forward and backward passes over the role's messages, is
  split: each rank computes log-probs of its contiguous share of the messages (`shard`), the shares are
  all-gathered, and every rank evaluates the whole loss; only its own share carries a gradient, so the
  gradients summed over ranks (`all_reduce_gradients`, one flat all-reduce) are exactly the
  single-process gradient, up to float summation order;
- every number the trust region decides on (the running and final d_hat) is taken from rank 0
  (`agree`), so the accept / backtrack / reject decision is made once and is the same on every rank.

Why not DistributedDataParallel: DDP averages per-rank losses, but the TeamTR loss is not a mean of
per-rank losses (group-normalised advantages, message-level ratios and the KL penalty are normalised over
the whole minibatch), and only the active role's adapter gets a gradient. Gathering the log-probs and
summing the gradients keeps the loss exactly the single-process one; the collectives used are
torch.distributed's own (gloo on CPU, NCCL on GPU).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


class RankFailedError(RuntimeError):
    """Rank 0 failed a step every rank waits on (a rollout, an evaluation); the others stop with it."""


@dataclass(frozen=True)
class DataParallel:
    rank: int
    world_size: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, timeout_s: float = 1800.0) -> DataParallel | None:
        """The process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR/PORT), joined once; None
        for a single process. gloo on CPU, NCCL when CUDA is there."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return None
        if not dist.is_initialized():
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
        return cls(dist.get_rank(), dist.get_world_size())

    def barrier(self) -> None:
        dist.barrier()

    def on_main(self, fn: Callable[[], T]) -> T:
        """fn() on rank 0, its result broadcast to every rank; if it raises there, every rank raises."""
        box: list[Any] = [None]
        if self.is_main:
            try:
                box[0] = ("ok", fn())
            except Exception as e:
                box[0] = ("error", f"{type(e).__name__}: {e}")
                dist.broadcast_object_list(box, src=0)
                raise
        dist.broadcast_object_list(box, src=0)
        kind, value = box[0]
        if kind == "error":
            raise RankFailedError(f"rank 0 failed: {value}")
        return value

    def agree(self, value: float) -> float:
        """Rank 0's value of a number every rank computed (the same up to float order): one decision."""
        t = torch.tensor([value], dtype=torch.float64)
        dist.broadcast(t, src=0)
        return float(t.item())

    def shard(self, n: int) -> tuple[int, int]:
        """[start, end) of this rank's contiguous share of n items (sizes differ by at most 1)."""
        base, extra = divmod(n, self.world_size)
        start = self.rank * base + min(self.rank, extra)
        return start, start + base + (1 if self.rank < extra else 0)

    def gather_rows(self, local: torch.Tensor, n: int) -> torch.Tensor:
        """[n, ...]: every rank's rows of a row-sharded tensor, in rank order; this rank's rows are
        `local` itself (its gradient flows), the others' are received values without one."""
        size = -(-n // self.world_size)  # all_gather needs equal shapes: pad every share to the largest
        padded = torch.nn.functional.pad(local.detach(), (0, 0, 0, size - local.shape[0]))
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded.contiguous())
        rows = []
        for r in range(self.world_size):
            start, end = DataParallel(r, self.world_size).shard(n)
            rows.append(local if r == self.rank else parts[r][: end - start])
        return torch.cat(rows)

    def all_reduce_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Sum every parameter's gradient over the ranks (a rank whose share was empty adds zeros)."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
