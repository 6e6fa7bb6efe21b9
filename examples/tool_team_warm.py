"""The tool team's warm start: the tiny character-level model pre-trained on tool-team demonstrations
(training/warmstart/tool_demos.py: the solver calls `calc`, sometimes with a slipped expression, or
answers directly; the reviewer confirms or corrects), so that it starts out calling the tool some of the
time and TeamTR has tool use to reinforce.

    python -m examples.tool_team_warm                 # -> runs/tool_team_warm (examples/tool_team.yaml's model)
    python -m examples.tool_team_warm --steps 40 --out DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from langchain_core.utils.function_calling import convert_to_openai_tool

from examples.tool_team import SOLVER_PROMPT, TOOLS, roles
from teamtr.training.warmstart import WarmStartConfig
from teamtr.training.warmstart.tool_demos import ToolDemoMix, ToolTeamPrompts, build_tool_warm_model

WARM_DIR = Path("runs/tool_team_warm")
WARM_STEPS = 300
WARM_BATCH = 8  # episodes per step


def prompts() -> ToolTeamPrompts:
    """The example's own prompts and tool schema, as its graph renders them."""
    reviewer = next(r for r in roles() if r.name == "reviewer")
    return ToolTeamPrompts(
        SOLVER_PROMPT, reviewer.system_prompt, tuple(convert_to_openai_tool(t) for t in TOOLS)
    )


def build(
    out: Path = WARM_DIR, steps: int = WARM_STEPS, seed: int = 0, mix: ToolDemoMix = ToolDemoMix()
) -> dict:
    cfg = WarmStartConfig(max_steps=steps, seed=seed, batch_size=WARM_BATCH)
    return build_tool_warm_model(prompts(), out, cfg, mix)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.tool_team_warm", description=__doc__)
    parser.add_argument("--out", type=Path, default=WARM_DIR)
    parser.add_argument("--steps", type=int, default=WARM_STEPS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--call-rate", type=float, default=ToolDemoMix.call_rate)
    parser.add_argument("--slip-rate", type=float, default=ToolDemoMix.slip_rate)
    args = parser.parse_args(argv)
    report = build(args.out, args.steps, args.seed, ToolDemoMix(args.call_rate, args.slip_rate))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
