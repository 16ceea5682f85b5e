# ttmirror — two commands matter on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
# ttnn logs its whole config at DEBUG on import; keep benchmark and test output readable.
export LOGURU_LEVEL ?= WARNING
.DEFAULT_GOAL := help

VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# vLLM's own environment: vLLM needs numpy>=2, ttnn numpy<2 (README, "vLLM on the TT mirror").
VENV_VLLM  := .venv-vllm
STAMP_VLLM := $(VENV_VLLM)/.installed

# A working python3.12: the one on PATH (pyenv shims honour .python-version), else pyenv's 3.12.1.
PYTHON312 ?= $(shell for c in python3.12 "$$HOME/.pyenv/versions/3.12.1/bin/python3.12" /usr/local/bin/python3.12 /usr/bin/python3.12; do \
	if "$$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then echo "$$c"; break; fi; done)

.PHONY: help demo test docs lint bench-check prove bench-device spec setup setup-vllm serve-vllm system-deps clean bench-engine bench-validate soak bench-serve

help:
	@echo "make demo         check the model, write graphs and the review report to out/, serve a tiny Qwen3 at depth 2"
	@echo "make test         the whole test suite (what CI runs)"
	@echo "make docs         the documentation site (MkDocs, strict) into out/site"
	@echo "make bench-check  TLC against the manifest; the explorer beside TLC"
	@echo "make prove        the proof for every size (z3) at every option set the manifest lists as passing"
	@echo "make bench-device emulated device commands per second"
	@echo "make bench-engine serving tokens/s at depth 2 vs 1; overlap under layout churn"
	@echo "make bench-validate  a 10,000-step serving run validated against the model"
	@echo "make soak         100,000 serving steps with device faults, replayable from the seed"
	@echo "make spec         regenerate the generated parts of the spec (src/ttmirror/specs/)"
	@echo "make serve-vllm   vLLM's own engine and scheduler serving through the TT mirror"
	@echo "make bench-serve  vllm serve on the TT mirror under vLLM's own client (vllm bench serve): async vs sync"
	@echo "make lint         ruff, mypy and import-linter"

setup: $(STAMP) system-deps

$(STAMP): pyproject.toml
	@if [ -z "$(PYTHON312)" ]; then echo "error: Python 3.12 not found (install it, or pyenv install 3.12.1)" >&2; exit 2; fi
	@test -x $(PY) || "$(PYTHON312)" -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

# vLLM 0.33.0 from the registry (about 9 GB with its CUDA torch), and our plugin for it.
setup-vllm: $(STAMP_VLLM)

$(STAMP_VLLM): vllm_bridge/pyproject.toml
	@if [ -z "$(PYTHON312)" ]; then echo "error: Python 3.12 not found (install it, or pyenv install 3.12.1)" >&2; exit 2; fi
	@test -x $(VENV_VLLM)/bin/python || "$(PYTHON312)" -m venv $(VENV_VLLM)
	$(VENV_VLLM)/bin/python -m pip install -q --upgrade pip
	$(VENV_VLLM)/bin/python -m pip install -q vllm==0.33.0
	$(VENV_VLLM)/bin/python -m pip install -q --no-deps -e vllm_bridge
	@touch $(STAMP_VLLM)

# Graphviz's dot renders SVG graphs; Java runs TLC. Debian's packages provide both.
system-deps:
	@missing=""; \
	command -v dot >/dev/null 2>&1 || missing="$$missing graphviz"; \
	command -v java >/dev/null 2>&1 || missing="$$missing openjdk-17-jre-headless"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null 2>&1 || missing="$$missing chromium-driver"; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	if [ -n "$$missing" ]; then \
		echo "installing$$missing"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

demo: setup
	$(VENV)/bin/ttmirror demo --out out
	$(VENV)/bin/ttmirror mutants --config eager-2cq --json --traces out/mutant-traces > out/kills.json
	@echo "== serving depth 2 vs depth 1 (make bench-engine)"
	$(PY) benchmarks/bench_engine.py --json out/bench-engine.json > out/bench-engine.txt
	@tail -n 3 out/bench-engine.txt
	@echo "== the review report (open it in a browser)"
	$(VENV)/bin/ttmirror report -o out/report --mutants out/kills.json \
		--bench-engine out/bench-engine.json
	@echo "== the documentation site (open out/site/index.html)"
	$(MAKE) --no-print-directory docs
	$(VENV)/bin/ttmirror serve-demo --model tiny-qwen3 --backend tt

# One pytest worker per core (pytest-xdist); worksteal hands a finished worker part of a busy
# one's queue, so the few long tests do not leave a core idle at the end. TEST_WORKERS=0 runs
# the suite in this process (what a debugger or -x wants).
TEST_WORKERS ?= auto
test: setup setup-vllm
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy src/ttmirror
	$(VENV)/bin/lint-imports --no-cache
	$(MAKE) --no-print-directory docs
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=40

serve-vllm: setup setup-vllm
	$(PY) -m ttmirror serve-vllm --model tiny-qwen3

# `vllm serve` on the mirror under vLLM's own load client, async and sync, without and with
# drafts; vLLM's figures and async/sync ratios; every run's events validated.
bench-serve: setup setup-vllm
	@mkdir -p out
	$(PY) benchmarks/bench_serve.py --json out/bench-serve.json

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy src/ttmirror
	$(VENV)/bin/lint-imports --no-cache

# The documentation site: docs/ and the pages docs/hooks.py generates (the spec, the CLI
# reference, the drawing), strict (a broken link fails), into out/site; it opens offline.
docs: setup system-deps
	$(VENV)/bin/mkdocs build --strict --quiet

prove: setup
	$(VENV)/bin/ttmirror prove --manifest

bench-check: setup
	$(PY) benchmarks/bench_check.py

clean:
	rm -rf out .pytest_cache .ruff_cache .mypy_cache

spec: setup
	$(PY) -m ttmirror.report.specdoc

bench-device: setup
	$(PY) benchmarks/bench_device.py

bench-engine: setup
	@mkdir -p out
	$(PY) benchmarks/bench_engine.py --json out/bench-engine.json

bench-validate: setup
	$(PY) benchmarks/bench_validate.py

# The serving loop for 100,000 steps with a device fault armed before about 1% of them, the
# device on its seeded simulated clock (a seed replays the run): no hazard, no token lost or
# duplicated, no buffer leaked. SOAK_CLOCK=threaded runs the command queues on worker threads.
SOAK_STEPS ?= 100000
SOAK_CLOCK ?= simulated
soak: setup
	$(VENV)/bin/ttmirror soak --steps $(SOAK_STEPS) --fault-rate 0.01 --seed 0 --clock $(SOAK_CLOCK)

.PHONY: fuzz-long
# The conformance state machine under HypoFuzz: a long coverage-guided campaign over all cores,
# sharing .hypothesis/ with dev runs (stop it with Ctrl-C; the dashboard prints its address).
# DATABASE=redis://HOST:PORT/DB shares the example database with every machine of a campaign.
DATABASE ?=
fuzz-long: setup
	TTMIRROR_DATABASE=$(DATABASE) $(VENV)/bin/hypothesis fuzz --no-dashboard -- src/ttmirror/conformance/fuzz_target.py
