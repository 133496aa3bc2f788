# specfleet developer entry points. `make run` and `make test` are the README's two commands.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

.PHONY: setup run check bench collection ee-context lint docs unit integration test-reliability molecule molecule-local molecule-container test-hosts-deps test-images browser-deps test clean

setup:  ## controller venv (ansible-core, molecule, testinfra, linters); this checkout linked as the collection specfleet.ascend
	@scripts/setup-controller

# ARGS goes to ansible-playbook as given: make run ARGS='-e train_epochs=2 -e specfleet_serve_port=8100'
ARGS ?=

run: setup  ## the whole job on this machine, CPU profile (ARGS='...' passes ansible-playbook options)
	$(BIN)/ansible-playbook site.yml -i inventory/local.yml $(ARGS)

check: setup  ## what a run would change, without changing it (ARGS as for run)
	$(BIN)/ansible-playbook site.yml -i inventory/local.yml --check $(ARGS)

bench: setup  ## wall time: forced full runs vs the bare shell pipeline (3 pairs), no-op re-runs, the fleet's no-op and its job when its hosts are up; writes docs/benchmarks.md
	$(BIN)/python scripts/bench

collection: setup  ## the collection specfleet.ascend from this checkout: dist/specfleet-ascend-<version>.tar.gz
	rm -rf dist
	$(BIN)/ansible-galaxy collection build --output-path dist .

ee-context: collection  ## execution-environment.yml's build context in context/ (ansible-builder create); build it with ansible-builder build
	$(BIN)/ansible-builder create --file execution-environment.yml --context context

lint: setup
	scripts/role-docs --check
	$(BIN)/ansible-lint
	$(BIN)/yamllint -s .
	$(BIN)/ruff check python_helpers tests plugins molecule scripts/bench scripts/failure-digest
	$(BIN)/ruff format --check python_helpers tests plugins molecule scripts/bench scripts/failure-digest

docs: setup  ## regenerate roles/*/README.md from each role's meta/argument_specs.yml (aar-doc)
	scripts/role-docs

# Two workers, one module each at a time (a module's fixtures, such as the tiny models, built once).
UNIT_WORKERS ?= 2
unit: setup browser-deps
	$(BIN)/python -m pytest -n $(UNIT_WORKERS) --dist loadfile tests/unit

# Two workers, one test module each at a time (--dist loadfile keeps a module's shared runs and
# fixtures in one process): most runs are one ansible-playbook on one core, so two run side by side.
INTEGRATION_WORKERS ?= 2
integration: setup  ## real Ansible runs: mock-NPU npu_env, git and wheelhouse sources, containers
	$(BIN)/python -m pytest -n $(INTEGRATION_WORKERS) --dist loadfile --durations=25 tests/integration

# The integration tests marked slow, and only those (make integration runs the rest). The
# container modules decide at collection whether their images exist, so they are built first.
test-reliability: setup test-images  ## slow: runs killed (SIGINT/SIGKILL), vLLM dying, corrupted artifacts, ports, disk, host lock, secrets, paths with spaces, the install and npu_env variants CI leaves out
	SPECFLEET_SLOW_TESTS=1 $(BIN)/python -m pytest -s -m slow tests/integration

# A scenario ends with destroy, so a failed run's task, recap and verdict end up far above the
# end of the output, where a log that keeps only its tail loses them: on failure they are
# printed again (scripts/failure-digest).
define molecule_test
	@log=$$(mktemp); set -o pipefail; \
	$(BIN)/molecule test -s $(1) 2>&1 | tee "$$log" \
	  || { status=$$?; scripts/failure-digest "$$log"; rm -f "$$log"; exit $$status; }; \
	rm -f "$$log"
endef

molecule: setup test-hosts-deps test-images  ## four real hosts (atlas-a2, atlas-a3, ascend-950's two-host job in container runtime): converge, idempotence, hosts broken and lost on purpose, verify
	$(call molecule_test,fleet)

molecule-container: setup test-images  ## the whole CPU pipeline inside a podman container on localhost: converge, idempotence (container kept), a mount added (container recreated, no stage redone), verify
	$(call molecule_test,container)

molecule-local: setup  ## the whole CPU pipeline on localhost: converge, idempotence, train_epochs changed, verify
	$(call molecule_test,default)

test-hosts-deps:  ## what scripts/test-hosts needs (root): sshd, ip, unshare
	@scripts/test-hosts deps

browser-deps:  ## Debian's chromium (root), for the fleet.html tests in a real headless browser (Playwright drives it)
	@command -v chromium >/dev/null 2>&1 || { apt-get update -q && apt-get install -y -q chromium; }

test-images:  ## container engines and test images (root): podman + runc, Debian's docker.io (dockerd started), images built from a debootstrap rootfs
	@scripts/test-images deps
	@scripts/test-images dockerd start
	@scripts/test-images build --engine all

# Each part's time is printed, so a slow suite shows where its minutes go. The container
# scenario (the whole pipeline in a podman container, ~8 min) is outside CI's budget, like
# test-reliability: run both before calling a change to the container runtime or to the
# stages' failure handling done.
TEST_PARTS := lint unit integration molecule
test:  ## everything CI runs
	@for part in $(TEST_PARTS); do \
	  start=$$SECONDS; $(MAKE) --no-print-directory $$part || exit 1; \
	  echo "=== make $$part: $$((SECONDS - start)) s"; \
	done

clean:  ## remove the local work root and caches (not the controller venv)
	rm -rf .work .cache reports
