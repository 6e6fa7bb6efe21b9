"""The test suite, one folder per code folder (tests/serving/ tests serving/, ...): tests/project/ holds the
repository-wide checks (layers, packaging, docs, README flows), tests/benchmarks/ the benchmark scripts'
tests. Shared fixtures live in conftest.py files (tests/conftest.py when several folders use them); plain
helpers in tests/support/. Each folder is a package, so test files may share a name across folders."""
