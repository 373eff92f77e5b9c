# samplerlab: `make run` sets everything up and runs the default experiment; `make test` tests.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
SAMPLERLAB := $(VENV)/bin/samplerlab
STAMP  := $(VENV)/.stamp-install
FRAMEWORKS_STAMP := $(VENV)/.stamp-frameworks
# On these machines both come from local disk (a CUDA build that also runs on the CPU).
TORCH  ?= torch==2.14.1 torchvision==0.29.1
SWEEP  ?= sampler=uniform,weighted,fixed_class,annealed,progressive,deferred,hard_mined,hybrid,mixture seed=0,1,2
PORT   ?= 5000
JOBS   ?= 4
NPROC  ?= 2

.PHONY: help install install-frameworks install-browser install-server install-system run sweep study advise paper ddp test test-quick lint docs bench bench-extract bench-features bench-race bench-advice tables report ui server gpu-check clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

install: $(STAMP)  ## create .venv and install samplerlab with its dev tools (once)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: install  ## the default experiment (synthetic long-tailed data, MLP, uniform sampler)
	$(SAMPLERLAB) run

sweep: install  ## every sampler x 3 seeds, one parent MLflow run (SWEEP="..." to change)
	$(SAMPLERLAB) run -m $(SWEEP)

ddp: install  ## one run in NPROC processes with DDP (torchrun; ARGS="sampler=hard_mined ...")
	$(VENV)/bin/torchrun --standalone --nproc_per_node=$(NPROC) -m runner $(ARGS)

study: install  ## a study sweep, its report on the parent run (NAME=digits; runner/conf/experiment/)
	$(SAMPLERLAB) run -m +experiment=$(or $(NAME),$(STUDY),digits)

# samplerlab advise (experiments/command.py) builds the race's overrides: DATA a .npz/.pt file,
# a folder of class folders, or unset (digits, the demo). Unset variables take its defaults:
# SAMPLERS raced from scratch, METHODS with MODEL=timm:<name> (WEIGHTS=<file>), VAL=20 per class.
ADVISE_ARGS = $(strip $(or $(DATA),digits) $(if $(MODEL),--model $(MODEL)) $(if $(WEIGHTS),--weights $(WEIGHTS)) \
	$(if $(SAMPLERS),--samplers $(SAMPLERS)) $(if $(METHODS),--methods $(METHODS)) $(if $(VAL),--val $(VAL)) \
	$(if $(BUDGET),--budget $(BUDGET)) $(if $(SIZE),--size $(SIZE)))
advise: install  ## which sampler for your data: a race on a validation split (DATA=file.npz|file.pt|folder; MODEL=timm:<name> WEIGHTS=<file>: a frozen backbone; VAL=20 per class, BUDGET=max runs, SIZE=image px, ARGS=...)
	$(SAMPLERLAB) advise $(ADVISE_ARGS) $(ARGS)

paper: install  ## the CIFAR-10-LT paper protocol, every row x 3 seeds, JOBS runs at once on one GPU (CIFAR=dir or JPEG=dir)
	$(SAMPLERLAB) run -m +experiment=cifar10_lt_paper hydra/launcher=joblib hydra.launcher.n_jobs=$(JOBS) \
		$(if $(JPEG),data=image_folder_lt data.root=$(JPEG),data.root=$(or $(CIFAR),data)) $(ARGS)

install-server:  ## PostgreSQL for `make server` and its test (Debian's package; as root)
	command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql)

install-frameworks: $(FRAMEWORKS_STAMP)  ## Lightning, Accelerate, torchdata, transformers into .venv, for tests/test_frameworks.py (once)

$(FRAMEWORKS_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install --quiet -e '.[frameworks]'
	touch $(FRAMEWORKS_STAMP)

test: install install-frameworks install-system  ## the test suite (three processes on two cores: many tests wait on servers and signals; each test, or each file whose tests share a slow fixture, to the next free one)
	$(PY) -m pytest -q -n 3 --dist loadgroup

test-quick: install  ## the unit tests alone (two processes, about a minute)
	$(PY) -m pytest -q -n 2 --dist loadgroup -m unit

lint: install install-frameworks  ## ruff lint and format check; mypy (strict on samplers/, runner/ and the plugin)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy  # every package, each as strict as pyproject.toml's [tool.mypy] says

docs: install  ## the manual (mkdocs.yml, docs/): mkdocs build --strict into site/, offline
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

bench: install  ## sampler speed vs torch and pytorch-metric-learning; the DataLoader path vs shuffle=True; the loop vs the bare train step
	$(PY) -m scripts.bench
	$(PY) -m scripts.bench_data
	$(PY) -m scripts.bench_loop

bench-extract: install  ## feature extraction: img/s, page faults and the share of the CPU's fp32 peak, torch (heap freed / kept) and onnxruntime side by side (~5 min on 2 cores); writes docs/results/extract_bench.md
	$(PY) -m pip install --quiet -e '.[bench,onnx]'
	$(PY) -m scripts.bench_extract

bench-features: install  ## a frozen ImageNet-pretrained EfficientNet-Lite0 on CIFAR-10-LT: features once, head runs, the race; beside random weights (CPU heavy: ~40 min on 2 cores); writes docs/results/
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) -m scripts.bench_features

bench-advice: install  ## the race's advice against the test-best candidate and scikit-learn's baselines on 8 tasks (CIFAR-10-LT at 4 imbalance factors and 2 validation sizes on pretrained features, digits, synthetic; CPU heavy: about 45 min on 2 cores); writes docs/results/advice_bench.json and advice.md
	$(PY) -m pip install --quiet -e '.[bench,onnx]'
	$(PY) -m scripts.bench_advice

bench-race: install  ## the race against the full 90-run digits grid; the race with stacked heads, one job at a time and a plain loop of as many heads; the published-recipe race as before lean children and shared prefixes, with lean children alone, and as now (CPU heavy: the grid alone ~12 min on 2 cores); writes docs/results/
	$(PY) -m scripts.bench_race
	$(PY) -m scripts.bench_race --heads
	$(PY) -m scripts.bench_prefixes

tables: install  ## re-render every results table in docs/ from docs/results/*.json
	$(PY) -m scripts.tables

report: install  ## the newest sweep's report, onto its parent run (PARENT=id, EXPERIMENT=samplerlab)
	$(SAMPLERLAB) report $(if $(PARENT),--parent $(PARENT),--experiment $(or $(EXPERIMENT),samplerlab))

# Debian's packages the suite needs that are missing, fetched in one apt-get call: one index
# update instead of one per package saves CI its second `apt-get update`.
SYSTEM_MISSING = $(strip $(if $(shell command -v chromium),,chromium) \
	$(if $(shell command -v initdb || ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null),,postgresql))

install-system:  ## chromium and PostgreSQL for make test, in one apt-get install (as root)
	$(if $(SYSTEM_MISSING),apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSTEM_MISSING),@true)

install-browser:  ## Debian's chromium for the browser test (as root; CI runs it before make test)
	command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

ui: install  ## MLflow UI for the local store (mlflow.db here, or MLFLOW_TRACKING_URI) on http://127.0.0.1:5000 (PORT=...)
	$(SAMPLERLAB) ui --port $(PORT)

gpu-check: install  ## on a GPU machine: the CUDA path end to end (device, bfloat16, data on the GPU), timed; loop vs bare step, eager vs compiled
	$(PY) -m scripts.gpu_check --out gpu-check.json
	$(PY) -m scripts.bench_loop --device cuda --batches 50

server: install install-server  ## shared tracking: mlflow server + PostgreSQL on 127.0.0.1:$(PORT) (data in server/)
	$(PY) -m runner.tracking.server --port $(PORT) --folder $(CURDIR)/server

clean:  ## remove the venv, tool caches, Hydra outputs (keeps mlflow.db and mlartifacts; samplerlab cache clear: the run caches)
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .hypothesis .cache outputs multirun site *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
