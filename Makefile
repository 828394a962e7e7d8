# Set-up and checks. Both targets build the virtual environment on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: run test venv clean examples bench

$(BIN)/omni-autoconf: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $@

venv: $(BIN)/omni-autoconf

# The main job: plan Qwen3-Omni on two H100s and write deploy.yaml.
run: venv
	$(BIN)/omni-autoconf --gpus 2xH100-80GB --model qwen3-omni-moe -o deploy.yaml

test: venv
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache deploy.yaml

# Regenerate examples/ and the generated blocks of README.md and docs/ (command samples, the
# pipelines table, the comparison table, --help); tests/test_examples.py fails when any is stale.
examples: venv
	$(BIN)/python examples/regenerate.py

# Solve times at scale, CP-SAT against brute force, CLI start-up: one run on this machine,
# written into docs/speed.md (figures vary by machine; nothing checks them for staleness).
bench: venv
	$(BIN)/python benchmarks/solve_times.py --readme
