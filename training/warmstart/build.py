"""The build loop: supervised training of a tiny Llama on every role's demonstrations until held-out
greedy TEAM accuracy enters a target band (partial competence, so RL has room), then save it.

The jump from ~0% to ~90% is sudden, so the build evaluates every `eval_every` steps, snapshots the
weights at every evaluation, and rolls back and evaluates more finely when one evaluation jumps over
the band. Out of steps, it keeps the best evaluated checkpoint.

Deterministic for a given config: inside `deterministic_torch` the torch thread count is the config's
(reductions split over another number of threads add in another order), kernels are the deterministic
ones, torch's and Python's random generators are seeded and restored afterwards, and every decision
(evaluate, roll back, stop) is taken at a step count, never on wall time.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from teamtr.training.tiny_models import build_char_tokenizer, new_model, save_model
from teamtr.training.warmstart.config import WarmStartConfig
from teamtr.training.warmstart.data import completion_loss, training_batches
from teamtr.training.warmstart.evaluate import evaluate_team, sampled_eval
from teamtr.training.warmstart.report import WarmStartReport, write_report, write_report_files
from teamtr.training.warmstart.shipped import build_environment, warn_if_not_shipped
from teamtr.training.warmstart.teams import warm_team

log = logging.getLogger(__name__)


@contextlib.contextmanager
def deterministic_torch(threads: int) -> Iterator[None]:
    """`threads` intra-op threads, deterministic kernels and a private RNG state; all restored after."""
    threads_before = torch.get_num_threads()
    deterministic_before = torch.are_deterministic_algorithms_enabled()
    warn_only_before = torch.is_deterministic_algorithms_warn_only_enabled()
    python_rng = random.getstate()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.set_num_threads(threads_before)
        torch.use_deterministic_algorithms(deterministic_before, warn_only=warn_only_before)
        random.setstate(python_rng)


def build_warm_model(cfg: WarmStartConfig, out_dir: str | Path, progress: bool = True) -> WarmStartReport:
    """Train the model until held-out greedy team accuracy enters the band, then save it to `out_dir`."""
    with deterministic_torch(cfg.threads):
        random.seed(cfg.seed)
        return _build(cfg, Path(out_dir), progress)


def lr_at(step: int, cfg: WarmStartConfig) -> float:
    """Linear warm-up, then constant: the stop comes from the accuracy band, not from a schedule's end."""
    return cfg.lr * min(1.0, (step + 1) / cfg.warmup_steps)


@dataclass
class _Snapshot:
    """Where a rollback returns to: the state right after an evaluation."""

    step: int
    train_tokens: int
    model: dict
    optimizer: dict


def _build(cfg: WarmStartConfig, out_dir: Path, progress: bool) -> WarmStartReport:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    start = time.perf_counter()
    tokenizer = build_char_tokenizer()
    task, team = warm_team(cfg)
    model = new_model(tokenizer, cfg.hidden, cfg.layers, cfg.heads, cfg.seed)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    eval_set = task.generate(cfg.eval_tasks, seed=f"warmstart-eval-{cfg.seed}")
    lo, hi = cfg.band

    # Data is indexed by step, so a rollback replays exactly the same batches.
    batches: dict[int, dict[str, torch.Tensor]] = {}  # kept from the last snapshot on
    stream = training_batches(tokenizer, task, team, cfg)
    produced = 0

    def batch_at(step: int) -> dict[str, torch.Tensor]:
        nonlocal produced
        while produced <= step:
            batches[produced] = next(stream)
            produced += 1
        return batches[step]

    step, train_tokens, rollbacks = 0, 0, 0
    eval_every = cfg.eval_every
    snapshot = _Snapshot(0, 0, copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict()))
    best: tuple[float, int, dict] | None = None  # (accuracy, step, weights) of the best evaluation <= band
    history: list[dict] = []
    stopped_because = "max_steps"
    train_seconds = 0.0
    bar = Progress(
        TextColumn("[bold]warm start[/]"), BarColumn(), TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(), disable=not progress, transient=False,
    )  # fmt: skip
    with bar:
        bar_task = bar.add_task("train", total=cfg.max_steps, status="")
        while step < cfg.max_steps:
            t0 = time.perf_counter()
            batch = batch_at(step)
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, cfg)
            loss = completion_loss(model, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            step += 1
            train_tokens += int(batch["attention_mask"].sum())
            train_seconds += time.perf_counter() - t0
            if step % eval_every:
                continue

            result, _ = evaluate_team(model, tokenizer, task, team, eval_set)
            row = {"step": step, "seconds": round(time.perf_counter() - start, 2), "loss": round(loss.item(), 4),
                   "team_accuracy": result.team_accuracy, "step_accuracy": result.step_accuracy,
                   "eval_every": eval_every}  # fmt: skip
            history.append(row)
            log.info("warm start %s", row)
            per_role = " ".join(f"{a:.0%}" for a in result.step_accuracy)
            bar.update(bar_task, completed=step,
                       status=f"step {step} loss {loss.item():.3f} team {result.team_accuracy:.0%} "
                              f"roles {per_role}")  # fmt: skip
            if result.team_accuracy > hi and eval_every > 1:
                # Jumped over the band between two evaluations: replay from the last one, looking closer.
                step, train_tokens = snapshot.step, snapshot.train_tokens
                model.load_state_dict(snapshot.model)
                optimizer.load_state_dict(snapshot.optimizer)
                eval_every = max(1, eval_every // 4)
                rollbacks += 1
                continue
            if result.team_accuracy >= cfg.stop_accuracy:
                stopped_because = "reached stop_accuracy"
                break
            snapshot = _Snapshot(step, train_tokens, copy.deepcopy(model.state_dict()),
                                 copy.deepcopy(optimizer.state_dict()))  # fmt: skip
            if best is None or result.team_accuracy > best[0]:
                best = (result.team_accuracy, step, snapshot.model)
            for old in [b for b in batches if b < step]:
                del batches[old]

        if stopped_because != "reached stop_accuracy" and best is not None:
            # Out of steps: the weights between two evaluations are unmeasured (and accuracy swings
            # from one evaluation to the next), so keep the best evaluated checkpoint instead.
            model.load_state_dict(best[2])
            stopped_because += f"; kept the best evaluated checkpoint (step {best[1]}, {best[0]:.0%})"
        model.eval()
        final_set = task.generate(cfg.final_eval_tasks, seed=f"warmstart-final-{cfg.seed}")
        greedy, _ = evaluate_team(model, tokenizer, task, team, final_set)
        torch.manual_seed(cfg.seed)
        sampled, pass_at_k = sampled_eval(
            model, tokenizer, task, team, final_set[: cfg.sampled_eval_tasks], cfg.samples_per_task
        )

    save_model(model, tokenizer, out_dir)
    report = WarmStartReport(
        path=str(out_dir),
        config=dataclasses.asdict(cfg),
        seconds=time.perf_counter() - start,  # everything but writing this report and its plot
        train_seconds=train_seconds,
        optimizer_steps=step,
        train_tokens=train_tokens,
        in_band=lo <= greedy.team_accuracy <= hi,
        greedy=greedy,
        sampled=sampled,
        pass_at_k=pass_at_k,
        k=cfg.samples_per_task,
        stopped_because=stopped_because,
        rollbacks=rollbacks,
        threads=torch.get_num_threads(),
        history=history,
        environment=build_environment(),
    )
    write_report_files(report, out_dir)
    report.differs_from_shipped = warn_if_not_shipped(cfg, out_dir)
    if report.differs_from_shipped:
        write_report(report, out_dir)  # the report is not among the hashed files
    if not report.in_band:
        log.warning("warm start ended outside the band %s: %s", cfg.band, report.summary())
    return report
