# hoss: `make demo` runs the demo on a real local control plane; `make test` runs every check and test.
# Needs: Python >= 3.11, the Go toolchain (first build of the control-plane binaries) and apt (redis-server).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.stamp-install
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PYTEST_ARGS ?=

.PHONY: test demo deps venv binaries image image-test bench-test lint unit integration e2e chaos fuzz bench-large settings-doc down clean clean-all

# The long chaos scenarios (marker `chaos`) are left out here; `make chaos` runs every scenario. The container
# image's tests (marker `image`) run in `make image-test`, the benchmark's own runs (marker `bench`) in
# `make bench-test`.
# Two pytest-xdist workers, a test module each at a time (--dist loadfile): each worker starts its own local plane,
# and e2e tests spend most of their time waiting on the apiserver, so two share the machine's cores well. The long
# e2e modules are handed out first and the many short unit and integration modules last, so that the two workers
# finish together rather than one waiting on the other's last long module.
TEST_WORKERS ?= 2
test: deps binaries lint
	$(BIN)/pytest -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile -m "not chaos and not image and not bench" tests/e2e tests/integration tests/unit $(PYTEST_ARGS)

# `hoss bench --quick` and a small `--large` run end to end, every figure reported (tests/e2e/test_bench.py; about
# seven minutes, hence apart from `make test`).
bench-test: deps binaries
	$(BIN)/pytest -p no:cacheprovider -m bench tests/e2e/test_bench.py $(PYTEST_ARGS)

# hoss and kube-scheduler end to end at 5,000 and 20,000 kwok nodes, each alone (about an hour; run it on an otherwise
# idle machine): bench/results/large.json and docs/benchmarks-large.md.
bench-large: deps binaries
	$(BIN)/python -m dev bench --large

demo: deps binaries
	$(BIN)/python -m dev demo

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test,bench]'
	touch $@

# System packages the project needs; installed only when missing.
deps: venv
	@command -v redis-server >/dev/null || { \
	  echo "installing redis-server (Debian package)"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }
	@command -v redis-server >/dev/null || { echo "redis-server is still missing"; exit 1; }
	@command -v chromium >/dev/null || { \
	  echo "installing chromium and chromium-driver (Debian packages, for the dashboard's browser test)"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; }
	@command -v chromium >/dev/null || { echo "chromium is still missing"; exit 1; }

# Builds kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd and kwok once into the cache (see
# README); reuses them after.
binaries: venv
	$(BIN)/python -m dev local build

# The container image (deploy/Containerfile), built for real with Debian's buildah from a Debian bookworm root
# filesystem that mmdebstrap makes from Debian's packages: no base image is pulled. Installs both when missing.
# IMAGE=name:tag names it (default ghcr.io/hoss-sched/hoss:<version>); `python -m dev image --help` for more.
IMAGE ?=
image: venv
	@missing=""; for tool in buildah mmdebstrap; do command -v $$tool >/dev/null || missing="$$missing $$tool"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing$$missing (Debian packages)"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; fi
	$(BIN)/python -m dev image build $(if $(IMAGE),--image $(IMAGE))

# Every console script of the built image answers --help, and each service starts inside it against a local
# plane (tests/e2e/test_image.py; minutes, hence apart from `make test`).
image-test: image deps binaries
	$(BIN)/pytest -p no:cacheprovider -m image tests/e2e/test_image.py $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

unit: venv
	$(BIN)/pytest -p no:cacheprovider tests/unit $(PYTEST_ARGS)

integration: deps venv
	$(BIN)/pytest -p no:cacheprovider tests/integration $(PYTEST_ARGS)

e2e: deps binaries
	$(BIN)/pytest -p no:cacheprovider -m "not chaos and not image" tests/e2e $(PYTEST_ARGS)

chaos: deps binaries
	$(BIN)/pytest -p no:cacheprovider -s tests/e2e/test_chaos.py $(PYTEST_ARGS)

# 10,000 generated reviews per property against the real webhook over TLS (make test runs 300 of each).
fuzz: deps venv
	HOSS_FUZZ_REVIEWS=10000 $(BIN)/pytest -p no:cacheprovider -m fuzz tests/integration $(PYTEST_ARGS)

# docs/settings.md from the services' settings models (tests/unit/test_settings_doc.py fails when it is stale).
settings-doc: venv
	$(BIN)/python -m dev.settings_doc > docs/settings.md.new && mv docs/settings.md.new docs/settings.md

down: venv
	$(BIN)/python -m dev local down

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

# Everything the two commands left on the machine: the local plane (stopped) and its state directory, the
# control-plane binaries hoss built, the wheel test's wheel cache, Go's build and module caches (`go clean -cache
# -modcache`: shared with any other Go work of this user), then what `make clean` removes.
clean-all:
	if [ -x $(BIN)/python ]; then $(BIN)/python -m dev local clean --go-cache; else echo "no $(BIN)/python: local plane and caches left as they are"; fi
	$(MAKE) clean
