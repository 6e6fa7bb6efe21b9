# Two commands do all set-up on a fresh machine:
#   make demo   create .venv, install teamtr, run the main job (train a team with TeamTR, show the result)
#   make test   same set-up, run the whole test suite (starts the vLLM and Phoenix servers it needs)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU build of torch; a plain `torch` requirement with nothing installed pulls a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: demo test install lint clean servers

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/teamtr demo --out runs/demo

test: $(STAMP)
	bash scripts/test.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) runs build *.egg-info
