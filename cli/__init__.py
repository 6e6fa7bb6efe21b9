"""The `teamtr` command line: parses options, wires the areas (graphs, evals, serving, training), prints results."""
