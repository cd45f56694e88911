# The two commands of the README's quick start; both set up .venv first (scripts/setup.sh is idempotent).
VENV := .venv
MODEL ?= kimi-k3.1-pro

.PHONY: setup port test test-fast lint

setup:
	./scripts/setup.sh
	./scripts/setup-debian.sh bwrap bubblewrap "candidates run with the weaker isolation (an audit hook, no namespaces)"

# The main job: port every block of the model card that has a spec, on the Triton interpreter when no GPU is seen;
# then hold the model's published transformers code with the ported kernels to the code as shipped.
port: setup
	$(VENV)/bin/workbench port --model $(MODEL)
	$(VENV)/bin/workbench parity $(MODEL)

# The whole suite (CI runs this through .ci/run), in a random order: the seed is in the header
# ("Using --randomly-seed=N"); `make test PYTEST_ARGS=--randomly-seed=N` reruns that order.
test: setup
	./scripts/setup-vllm.sh
	./scripts/setup-debian.sh chromium chromium "the browser tests will be skipped"
	./scripts/setup-debian.sh '/usr/lib/postgresql/*/bin/initdb' postgresql "the PostgreSQL store tests will be skipped"
	$(VENV)/bin/ruff check workbench tests bench
	$(VENV)/bin/python -m pytest -n 2 --dist loadfile --durations=15 --junitxml=junit.xml $(PYTEST_ARGS)

# The edit-test loop: everything but the interpreter, end-to-end and slow tests.
test-fast: setup
	$(VENV)/bin/python -m pytest -n 2 -m "not interpreter and not e2e and not slow" $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check workbench tests bench
