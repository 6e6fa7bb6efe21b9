"""Plug-and-play role replacement: Stage-0 alignment of a newcomer model (docs/swap.md).

    teamtr swap RUN_DIR --role R --model PATH [--out NEW_RUN_DIR] [--probes 500] [--delta0 0.01]

One job per module:
- config.py: `SwapConfig` (what a swap does) and `SwapProgress` (the hooks the CLI's progress bars use);
- probes.py: the probe set, contexts at role R's turns from episodes of the current team;
- stage0.py: `Aligner`, the reverse-KL alignment rounds of the newcomer to the incumbent (or to the
  geometric mixture of both), protocol unification, the token-level and text-level (across tokenizers)
  divergences;
- run.py: `swap_role`, the whole swap: load the run, probes, Stage-0, and the new run directory that
  `teamtr train NEW_RUN_DIR/config.yaml` continues.
"""

from teamtr.training.swap.config import Divergence, SwapConfig, SwapProgress, Target
from teamtr.training.swap.probes import Probe, build_probes, probes_from, write_probes
from teamtr.training.swap.run import SwapResult, direct_and_aligned, load_run, swap_role, team_engine
from teamtr.training.swap.stage0 import Aligner, Samples, same_tokenizer, sequence_logprob
from teamtr.training.vocab_kl import Side

__all__ = [
    "Aligner",
    "Divergence",
    "Probe",
    "Samples",
    "Side",
    "SwapConfig",
    "SwapProgress",
    "SwapResult",
    "Target",
    "build_probes",
    "direct_and_aligned",
    "load_run",
    "probes_from",
    "same_tokenizer",
    "sequence_logprob",
    "swap_role",
    "team_engine",
    "write_probes",
]
