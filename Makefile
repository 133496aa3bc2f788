# specfleet developer entry points. `make run` and `make test` are the README's two commands.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

.PHONY: setup run check lint unit integration molecule test clean

setup:  ## controller venv (ansible-core, molecule, testinfra, linters) + collections
	@scripts/setup-controller

run: setup  ## the whole job on this machine, CPU profile
	$(BIN)/ansible-playbook site.yml -i inventory/local.yml

check: setup  ## what a run would change, without changing it
	$(BIN)/ansible-playbook site.yml -i inventory/local.yml --check

lint: setup
	$(BIN)/ansible-lint
	$(BIN)/yamllint -s .
	$(BIN)/ruff check python_helpers tests callback_plugins molecule
	$(BIN)/ruff format --check python_helpers tests callback_plugins molecule

unit: setup
	$(BIN)/python -m pytest tests/unit

integration: setup  ## real Ansible runs: mock-NPU npu_env, git and wheelhouse sources
	$(BIN)/python -m pytest tests/integration

molecule: setup  ## the whole CPU pipeline on this machine: converge, idempotence, testinfra
	$(BIN)/molecule test --all

test: lint unit integration molecule  ## everything CI runs

clean:  ## remove the local work root and caches (not the controller venv)
	rm -rf .work .cache reports
