# The README's two commands: `make up` (set up, then run kvferry locally) and `make test` (set up, then every test).
# Each step is skipped when its stamp is newer than what it depends on, so a second run is quick.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# uv's cache lives outside the checkout, so a fresh clone (CI) re-creates .venv from it in seconds.
UV := $(BIN)/uv
STAMP := $(VENV)/.installed
CACHE ?= $(HOME)/.cache/kvferry

.PHONY: up test lint unit venv system-packages cluster-binaries clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(UV): $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check uv

# The transfer engine's C put loop is built by the install too.
$(STAMP): pyproject.toml transfer/_ucp_batch.c $(UV)
	$(UV) pip install --python $(BIN)/python -e '.[test,dev]'
	touch $(STAMP)

venv: $(STAMP)

system-packages:
	@command -v redis-server >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; }

cluster-binaries:
	bash tests/cluster/build.sh

lint: venv
	$(BIN)/ruff check .

# A local cluster: redis-server (when installed), one prefill node, one decode node and the router on
# port 8000. Without MODEL it serves a tiny random checkpoint (random text). Ctrl-C stops it all.
MODEL ?=
up: venv
	$(BIN)/kvferry up $(if $(MODEL),--model $(MODEL))

# pytest's exit code 5 means no test ran: reported and failed like any other failure.
test: venv system-packages cluster-binaries lint
	@$(BIN)/python -m pytest; status=$$?; \
	  if [ $$status -eq 5 ]; then echo "make test: pytest collected no tests" >&2; fi; exit $$status

clean:
	rm -rf $(VENV) build dist *.egg-info
