# The two set-up commands of the README: `make run` (the main job: gyre quickstart, demonstrations -> SFT ->
# elastic RL of the tiny model on the toy suite, the held-out set evaluated after each phase) and `make test`
# (lint, types, tests).
# Each creates .venv and installs what it needs (scripts/setup.sh).
.PHONY: setup run test bench
VENV := .venv/bin

setup:
	bash scripts/setup.sh

run: setup
	$(VENV)/gyre quickstart --model models/tiny

test: setup
	$(VENV)/ruff check src tests benchmarks examples
	$(VENV)/ruff format --check src tests benchmarks examples
	$(VENV)/mypy
	$(VENV)/python -m pytest -q --durations=25

bench: setup
	$(VENV)/python benchmarks/engine.py
