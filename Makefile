# Two commands: `make demo` and `make test`. Both build .venv from scratch when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PEERS := .venv-peers
QUALITY := .venv-quality

.PHONY: demo test test-fast lint bench peers wheelhouse clean

# pyproject.toml declares ranges; constraints.txt holds the exact versions the suite is tested with
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/cosparse train --config configs/demo.yaml

lint: $(STAMP)
	$(BIN)/ruff check cosparse tests benchmarks examples
	$(BIN)/lint-imports

# OpenMP (torch's and numba's pools) sleeps instead of spinning between parallel regions, unless
# the caller set a policy: beside busy processes (a loaded CI machine) the DIN exactness test took
# 26 s instead of 128 s (benchmarks/README.md, "CPU contention")
OMP_POLICY := OMP_WAIT_POLICY=$(or $(OMP_WAIT_POLICY),PASSIVE)

test: $(STAMP) lint
	$(OMP_POLICY) $(BIN)/python -m pytest -q -p no:cacheprovider tests

test-fast: $(STAMP) lint
	$(OMP_POLICY) $(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow" tests

bench: $(STAMP)
	$(BIN)/python -m benchmarks.bench_inmemory --quick

peers:
	test -x $(PEERS)/bin/python || $(PY) -m venv $(PEERS)
	$(PEERS)/bin/pip install --quiet torch==2.13.0 fbgemm-gpu-cpu==1.8.0 tensordict torchmetrics==1.0.3 tqdm pyre-extensions numpy==2.4.6
	$(PEERS)/bin/pip install --quiet --no-deps torchrec==1.8.0
	$(PEERS)/bin/python -c "import torch, fbgemm_gpu, torchrec; print('peers:', torch.__version__, torchrec.__version__)"
	test -x $(QUALITY)/bin/python || $(PY) -m venv $(QUALITY)
	$(QUALITY)/bin/pip install --quiet torch==2.13.0 numpy==2.4.6 pandas==2.3.3 scikit-learn==1.7.2 tqdm==4.67.1
	$(QUALITY)/bin/pip install --quiet --no-deps torch-rechub==0.9.0
	$(QUALITY)/bin/pip install --quiet --no-deps recbole==1.2.1
	$(QUALITY)/bin/pip install --quiet --no-deps colorlog==6.12.0 colorama==0.4.6 pyyaml==6.0.4 texttable==1.7.3 scipy==1.17.1 tensorboard==2.21.0 protobuf==7.36.2 absl-py==2.5.1
	$(QUALITY)/bin/python -c "import torch, torch_rechub, recbole, recbole.config, recbole.data, recbole.trainer; print('quality peers: torch-rechub', torch_rechub.__version__ if hasattr(torch_rechub, '__version__') else '0.9.0', 'recbole', recbole.__version__)"

# the wheels benchmarks/gpu_check.sh installs on a CUDA machine without network: the project's
# and its dev extra's dependencies, not torch (that machine has its own). Build it for that machine's
# Python, e.g. WHEEL_ARGS="--only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64"
WHEELHOUSE ?= wheelhouse
WHEEL_ARGS ?=
wheelhouse: $(STAMP)
	mkdir -p $(WHEELHOUSE)
	$(BIN)/python -m benchmarks.wheelhouse requirements > $(WHEELHOUSE)/requirements.txt
	$(BIN)/pip download --dest $(WHEELHOUSE) $(WHEEL_ARGS) -c constraints.txt -r $(WHEELHOUSE)/requirements.txt

clean:
	rm -rf $(VENV) $(PEERS) $(QUALITY) build *.egg-info
