# Set-up and the two everyday commands. torch==2.13.0 is installed first, on its own: any looser request
# would pull a multi-GB CUDA build on machines without a GPU.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
ARGS ?=

.PHONY: setup run test test-all lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[dev,flower,vision,tune,tensorboard,mlflow,hf,dp]"
	touch $@

run: setup  ## the default job (or: make run ARGS="configs/x.yaml rounds=5")
	$(BIN)/manytask run $(ARGS)

test: setup  ## lint + every test but the slow end-to-end ones, over up to 4 processes
	$(BIN)/ruff check src tests scripts
	$(BIN)/python -m pytest --numprocesses auto --maxprocesses 4 --dist worksteal -m "not slow"

test-all: setup  ## lint + the whole test suite, slow end-to-end tests included (what CI runs)
	$(BIN)/ruff check src tests scripts
	$(BIN)/python -m pytest --numprocesses auto --maxprocesses 4 --dist worksteal

lint: setup
	$(BIN)/ruff check src tests scripts

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
