"""Tasks with exact verifiers, benchmark file loaders, the evaluation harness and reports."""
