# The two commands of the README's quick start; both set up .venv first (scripts/setup.sh is idempotent).
VENV := .venv
MODEL ?= kimi-k3.1-pro

.PHONY: setup port test lint

setup:
	./scripts/setup.sh

# The main job: port every block of the model card that has a spec, on the Triton interpreter when no GPU is seen.
port: setup
	$(VENV)/bin/workbench port --model $(MODEL)

# The whole suite (CI runs this through .ci/run).
test: setup
	./scripts/setup-browser.sh
	$(VENV)/bin/ruff check workbench tests dashboards bench
	$(VENV)/bin/python -m pytest -n 2 --dist loadfile --durations=15 --junitxml=junit.xml

lint: setup
	$(VENV)/bin/ruff check workbench tests dashboards bench
