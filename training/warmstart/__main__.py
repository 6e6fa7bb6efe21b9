"""`python -m teamtr.training.warmstart [SEED] [--task T] [--out DIR | --cache] [--threads N]`: build
(into DIR, default runs/warmstart-[T-]seedSEED, or into the model cache) with a progress bar, then print
the report. `teamtr warmstart --task T` is the same as `--cache`."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from teamtr.evals.tasks import task_names
from teamtr.training.warmstart.build import build_warm_model
from teamtr.training.warmstart.cache import ensure_warm_model
from teamtr.training.warmstart.config import warm_config_for
from teamtr.training.warmstart.report import load_report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m teamtr.training.warmstart", description=__doc__)
    parser.add_argument("seed", nargs="?", type=int, default=0)
    parser.add_argument("--task", default="chain", choices=task_names())
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--cache", action="store_true", help="build into the model cache (reused later)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the config's)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    threads = {} if args.threads is None else {"threads": args.threads}
    cfg = warm_config_for(args.task, seed=args.seed, **threads)
    if args.cache:
        report = load_report(ensure_warm_model(cfg))
    else:
        name = f"warmstart-seed{cfg.seed}" if cfg.task == "chain" else f"warmstart-{cfg.task}-seed{cfg.seed}"
        report = build_warm_model(cfg, args.out or Path("runs") / name)
    print(report.summary())
    print(json.dumps({k: v for k, v in report.as_dict().items() if k not in ("history", "files")}, indent=1))


if __name__ == "__main__":
    main()
