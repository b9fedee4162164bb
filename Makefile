# Orchard — every target is idempotent; `make test` and `make demo` set up first.
SHELL      := /bin/bash
VENV       := .venv
PY         := $(VENV)/bin/python
VERSION    := $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
AGENT_BIN  := build/orchard-agent
BOOT_BIN   := build/orchard-boot
AGENT_SRC  := $(shell find agent -name "*.go" -not -name "*_test.go") agent/go.mod
export HF_HUB_OFFLINE := 1

.PHONY: setup agent lint test test-fast test-unit test-go test-py test-k8s screenshots cluster cluster-down demo demo-env demo-gui demo-claw bench bench-k8s clean help

help:  ## list the targets
	@grep -E '^[a-z0-9-]+:.*##' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/'

setup:  ## install what is missing (apt packages, .venv, agent) and start dockerd
	@bash scripts/setup.sh
	@$(MAKE) --no-print-directory agent

agent: $(AGENT_BIN) src/orchard/bin/orchard-agent $(BOOT_BIN) src/orchard/bin/orchard-boot  ## build the static in-sandbox agent (and its loader for Kubernetes pods)

$(AGENT_BIN): $(AGENT_SRC)
	@mkdir -p build
	cd agent && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o ../$(AGENT_BIN) .

src/orchard/bin/orchard-agent: $(AGENT_BIN)
	@mkdir -p src/orchard/bin
	cp $(AGENT_BIN) $@

# The loader that starts the agent from its ConfigMaps in a Kubernetes pod: C, static, so it
# fits in one ConfigMap (1 MiB; a Go program would not).
$(BOOT_BIN): agent/boot/boot.c
	@mkdir -p build
	cc -static -Os -s -Wall -Wextra -Werror -o $@ $<

src/orchard/bin/orchard-boot: $(BOOT_BIN)
	@mkdir -p src/orchard/bin
	cp $(BOOT_BIN) $@

lint:  ## ruff, mypy --strict (src and tests), gofmt, go vet (linux and darwin)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench
	$(VENV)/bin/mypy
	@out=$$(gofmt -l agent node deploy/kubernetes/images/injector deploy/kubernetes/images/registry/gate); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	cd agent && go vet ./... && GOOS=darwin go vet ./... && GOOS=darwin go build -o /dev/null ./...
	cd deploy/kubernetes/images/injector && go vet ./...
	cd node && go vet ./...
	cd deploy/kubernetes/images/registry/gate && go vet ./...

test-go:  ## go test of the agent, the node helper and the registry's gate
	cd agent && go test -count=1 ./...
	cd node && go test -count=1 ./...
	cd deploy/kubernetes/images/registry/gate && go test -count=1 ./...

# The unit tests: every test not marked docker or k8s (tests/conftest.py marks them from
# the fixtures they use). DOCKER_HOST points at no engine, so a test that needs one but is
# not marked fails here instead of using whatever engine runs; bytecode is cached under
# build/ (where PYTHONDONTWRITEBYTECODE is set, each run would compile torch again).
test-unit:  ## pytest without the tests that need a Docker engine or a cluster
	env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=$(CURDIR)/build/pycache \
	  DOCKER_HOST=unix:///nonexistent/orchard-test-fast.sock \
	  $(VENV)/bin/pytest -q -m "not docker and not k8s" $(PYTEST_ARGS)

test-fast:  ## the quick loop: lint, go test and the unit tests, side by side; no engine, no cluster, no setup
	@$(MAKE) --no-print-directory -j3 --output-sync=target lint test-go test-unit

# pytest in two parts: three workers, each taking whole files (the machine is idle ~60% of a
# one-process run: engine calls, sandboxes starting, timeouts running out), then, alone, the
# tests marked `serial`, which stop or pause the Docker engine every other test uses (the
# daemon restart runs only here). A short --basetemp keeps sandboxes' socket paths under
# 108 bytes; --one-file-system never follows a mount a test left behind.
PYTEST_WORKERS ?= 3
test-py:
	@tmp=/tmp/ot.$$$$; rm -rf --one-file-system $$tmp; mkdir -p $$tmp; rc=0; \
	$(VENV)/bin/pytest -q --durations=30 -n $(PYTEST_WORKERS) --dist loadfile \
	  --basetemp=$$tmp/p -m "not serial" || rc=1; \
	ORCHARD_TEST_DOCKER_RESTART=1 $(VENV)/bin/pytest -q --basetemp=$$tmp/s -m serial || rc=1; \
	rm -rf --one-file-system $$tmp; exit $$rc

test: setup  ## lint, then go test and pytest (needs a Docker engine; setup starts one)
	@$(MAKE) --no-print-directory lint
	@$(MAKE) --no-print-directory test-go
	@$(MAKE) --no-print-directory test-py

screenshots:  ## rerun the browser tests so they rewrite docs/dashboard/*.png (a plain run writes build/screenshots/)
	ORCHARD_UPDATE_DOCS=1 $(VENV)/bin/pytest -q tests/dashboard

test-k8s: setup  ## the live suite on a real Kubernetes cluster built from source (make cluster), Orchard deployed in it
	@bash scripts/test-k8s.sh

cluster:  ## build (once, cached by version) and start a real two-node Kubernetes cluster (ORCHARD_CLUSTER_NODES=1: one); prints its kubeconfig
	@bash deploy/cluster/cluster.sh up

cluster-down:  ## stop that cluster and remove every process, mount, veth, iptables chain and folder it made
	@bash deploy/cluster/cluster.sh down

demo: setup  ## Orchard's main job in miniature: SWE tasks solved, graded, tabulated
	$(PY) -m orchard.swe.demo

demo-env: setup  ## a narrated tour of Orchard Env (sandboxes, exec, files, egress)
	$(PY) -m orchard.demo

demo-gui: setup  ## one browser episode on the offline shop, judged from the site's state
	$(PY) -m orchard.gui.demo

demo-claw: setup  ## one productivity task through the tool-calling harness, graded
	$(PY) -m orchard.claw.demo

bench: setup  ## benchmarks (not part of make test); e.g. BENCH_ARGS="--quick" or "--n 200 --only stress,exec"
	$(PY) bench/run_all.py $(BENCH_ARGS)

bench-k8s: setup  ## the Kubernetes benchmarks on the real node (cold create vs the kubelet, pool claims, 300 x 4); e.g. BENCH_ARGS="--only create"
	@bash scripts/bench-k8s.sh $(BENCH_ARGS)

.PHONY: bench-kwok bench-kwok-service
bench-kwok-service: setup  ## Orchard deployed (2 replicas) holding 5,000 sandboxes on 200 kwok Nodes, a pool of 1,000, quotas; e.g. BENCH_ARGS="--sandboxes 1000"
	@BENCH=k8s_kwok_service bash scripts/bench-k8s.sh $(BENCH_ARGS)

bench-kwok: setup  ## control-plane scale on kwok's fake Nodes (200 Nodes, 5000 pods) on the running trial cluster (`make cluster` first); e.g. BENCH_ARGS="--pods 1000"
	$(PY) bench/k8s_kwok.py --kubeconfig "$$(bash deploy/cluster/cluster.sh kubeconfig)" $(BENCH_ARGS)

clean:
	rm -rf build src/orchard/bin .mypy_cache .ruff_cache .pytest_cache
