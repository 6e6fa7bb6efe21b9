"""The `teamtr` command line: wires the areas (graphs, evals, serving, training) and owns no logic."""
