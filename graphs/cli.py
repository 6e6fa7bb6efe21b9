"""The `teamtr` command. Each area adds its commands from its own `cli.py`; this file only assembles."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="teamtr",
    help="Write a team of LLM role agents as a LangGraph graph, train it with TeamTR, serve it.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

# (module, attribute): a Typer app whose commands join the root (name None) or a named sub-app.
_PARTS: list[tuple[str, str | None]] = [
    ("teamtr.training.cli", None),  # demo, train, report
    ("teamtr.training.theory.cli", "theory"),  # theory scaling / check
    ("teamtr.training.swap_cli", None),  # swap
    ("teamtr.evals.cli", None),  # eval
    ("teamtr.serving.cli", None),  # serve, adapters, traces
]

for module_name, group in _PARTS:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:  # an area not written yet
        if e.name and module_name.startswith(e.name):
            continue
        raise
    part = module.app
    if group is None:
        app.registered_commands.extend(part.registered_commands)
        app.registered_groups.extend(part.registered_groups)
    else:
        app.add_typer(part, name=group)

if __name__ == "__main__":
    app()
