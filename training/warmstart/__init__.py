"""The small warm-started model of each task family, built here (no model hub) and cached.

`build_warm_model` makes the character tokenizer and a tiny LlamaForCausalLM (training/tiny_models.py),
trains it by supervised learning on demonstrations of every role's message (loss on the message tokens
only), and saves it with `save_pretrained` once held-out TEAM accuracy (greedy, the whole team, each
role acting on the messages the model itself wrote) enters a target band. `ensure_warm_model` caches
the result, keyed by a hash of the config. The saved folder loads with the plain
`AutoModelForCausalLM.from_pretrained(path)` / `PreTrainedTokenizerFast.from_pretrained(path)`.

One job per module:
- config.py: `WarmStartConfig`, each family's settings (`warm_config_for`), the cache key;
- teams.py: the team a build trains (the team `teamtr eval` runs) and what each role is taught;
- data.py: supervised examples rendered as at rollout time, batches, the loss;
- evaluate.py: the team's accuracy on held-out tasks;
- build.py: the deterministic training loop;
- report.py: `warmstart.json` and its history; cache.py: the model cache.
Measured builds: docs/evals.md, "Headroom".
"""

from teamtr.graphs.chain_team import chain_roles
from teamtr.training.tiny_models import new_model, save_model, tiny_random_model
from teamtr.training.warmstart.build import build_warm_model, deterministic_torch
from teamtr.training.warmstart.cache import cache_root, ensure_warm_model, is_complete
from teamtr.training.warmstart.config import (
    FAMILY_SETTINGS,
    WARMSTART_FORMAT,
    WarmStartConfig,
    warm_config_for,
)
from teamtr.training.warmstart.data import (
    IGNORE_INDEX,
    StepExample,
    collate,
    completion_loss,
    episode_examples,
    pack_episode,
    training_batches,
)
from teamtr.training.warmstart.evaluate import TeamEval, evaluate_team, sampled_eval, team_rollouts
from teamtr.training.warmstart.report import REPORT_FILE, WarmStartReport, load_report
from teamtr.training.warmstart.teams import ChainTeam, WarmTeam, warm_team

__all__ = [
    "FAMILY_SETTINGS",
    "IGNORE_INDEX",
    "REPORT_FILE",
    "WARMSTART_FORMAT",
    "ChainTeam",
    "StepExample",
    "TeamEval",
    "WarmStartConfig",
    "WarmStartReport",
    "WarmTeam",
    "build_warm_model",
    "cache_root",
    "chain_roles",
    "collate",
    "completion_loss",
    "deterministic_torch",
    "ensure_warm_model",
    "episode_examples",
    "evaluate_team",
    "is_complete",
    "load_report",
    "new_model",
    "pack_episode",
    "sampled_eval",
    "save_model",
    "team_rollouts",
    "tiny_random_model",
    "training_batches",
    "warm_config_for",
    "warm_team",
]
