# The two set-up commands of the README: `make run` (the main job: gyre quickstart, demonstrations -> SFT ->
# elastic RL of the tiny model on the toy suite, the held-out set evaluated after each phase) and `make test`
# (lint, types, and the fast tier of tests: each capability once end to end, minutes). `make test-all` runs every
# test (chaos, kills and resumes, Megatron, real NL2RepoBench tasks, the short quickstart, containers): what CI runs.
# The tiers are pytest markers (`slow`, declared in pyproject.toml); both run on two pytest-xdist workers, a
# module's tests on one worker (they share its engine and model fixtures), modules longest first, then the few tests
# marked `serial` alone (scripts/tests.sh). `make flake` repeats the tests marked `timing` beside two CPU hogs.
# Each creates .venv and installs what it needs (scripts/setup.sh). `make docs` builds the manual (docs/, mkdocs.yml)
# into site/ with every warning an error; CI builds it too.
.PHONY: setup run lint test test-all flake bench docs
VENV := .venv/bin

setup:
	bash scripts/setup.sh

run: setup
	$(VENV)/gyre quickstart

lint: setup
	$(VENV)/ruff check src tests benchmarks examples docs/hooks.py
	$(VENV)/ruff format --check src tests benchmarks examples docs/hooks.py
	$(VENV)/mypy

test: lint
	bash scripts/tests.sh fast

test-all: lint
	bash scripts/tests.sh all

flake: setup
	bash scripts/flake.sh

bench: setup
	$(VENV)/python benchmarks/engine.py

docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/mkdocs build --strict --site-dir site
