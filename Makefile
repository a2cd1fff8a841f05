# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed
BIN := $(VENV)/bin

.PHONY: run test test-interpreted test-systemd lint bench fuzz clean install generate docs compile

HELPER := client/sessionstore/wire/_cbor_bytes.c client/sessionstore/wire/cbor_core.c client/sessionstore/wire/cbor_core.h

# the editable install also builds the CBOR helper in place, when a C compiler works;
# then the request path is compiled (see compile)
$(STAMP): pyproject.toml setup.py $(HELPER) client/sessionstore/compiled_modules.py
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "make: $(PYTHON) not found (Python 3.11+ is required)" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	$(MAKE) --no-print-directory compile
	@touch $(STAMP)

# the request path compiled by mypyc, from the same source, in place (a few minutes):
# the second install runs in the venv, where mypy and what it reads are. Where no C
# compiler works it is skipped, and the source runs interpreted; so does a module's
# source edited since (sessionstore/build.py): make compile again to compile it.
compile:
	find client daemon -name '*.so' -delete  # a module gone leaves no stale build behind
	$(BIN)/pip install --quiet --no-build-isolation --no-deps -e .
	@$(BIN)/sessionstored --version

run: $(STAMP)
	$(BIN)/sessionstored $(ARGS)

# the CLI's bash and zsh completion and man pages, generated from its parser
PREFIX ?= $(HOME)/.local
install: $(STAMP)
	$(BIN)/python -m sessionstore.tools.install_docs $(PREFIX)

# the async clients' op methods, written from the blocking client's (a test checks it)
generate: $(STAMP)
	$(BIN)/python dev/generate_async_op_methods.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# the tests spread over every core (pytest-xdist; TEST_WORKERS=0 runs them in one process)
TEST_WORKERS ?= auto
test: lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

# the same source interpreted (SESSIONSTORE_BUILD=interpreted): the tests of every
# compiled module, and the end-to-end core
INTERPRETED_TESTS := $(addprefix tests/test_,$(addsuffix .py,protocol canonical snapshot \
	snapshot_bytes decide storage index txn generations expiry_schedule writer job_queue outbox readiness ops \
	watch access crash_sim model e2e_basic e2e_crash e2e_documents e2e_robustness \
	e2e_hostile build_choice))
test-interpreted: $(STAMP)
	SESSIONSTORE_BUILD=interpreted $(BIN)/python -m pytest -n $(TEST_WORKERS) $(INTERPRETED_TESTS) $(PYTEST_ARGS)

# boots a Debian VM under qemu (software emulation; root, debootstrap, qemu): see vm/
test-systemd: $(STAMP)
	$(BIN)/python -m pytest -q --timeout 2400 vm/test_vm_systemd.py $(PYTEST_ARGS)

# the documentation site from docs/ (mkdocs-material), into build/site; --strict: a
# broken link or a page missing from the nav fails the build
docs: $(STAMP)
	$(BIN)/pip install --quiet -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

bench: $(STAMP)
	$(BIN)/python -m bench $(BENCH_ARGS)

# coverage-guided fuzzing, FUZZ_SECONDS each (default 60): the CBOR helper's C core
# under AddressSanitizer and UndefinedBehaviorSanitizer (libFuzzer; needs clang),
# then the framing code through Python (atheris)
FUZZ_SECONDS ?= 60
FUZZ_BUILD := build/fuzz
fuzz: $(STAMP)
	@command -v clang >/dev/null 2>&1 || { echo "make fuzz: clang is required (libFuzzer)" >&2; exit 1; }
	mkdir -p $(FUZZ_BUILD)/corpus
	clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
		-Iclient/sessionstore/wire fuzz/fuzz_cbor_core.c client/sessionstore/wire/cbor_core.c \
		-o $(FUZZ_BUILD)/fuzz_cbor_core
	$(FUZZ_BUILD)/fuzz_cbor_core -max_total_time=$(FUZZ_SECONDS) -max_len=65536 \
		-artifact_prefix=$(FUZZ_BUILD)/ $(FUZZ_BUILD)/corpus fuzz/seeds
	$(BIN)/pip install --quiet atheris
	$(BIN)/python fuzz/fuzz_framing.py -max_total_time=$(FUZZ_SECONDS)

clean:
	rm -rf $(VENV) build *.egg-info
	find client daemon -name '*.so' -delete
