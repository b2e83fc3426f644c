# vk-cocoon: see README.md. `make demo` is the main job, `make test` the test run.

CARGO ?= cargo
JOBS ?= 2
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)

# Root-package integration tests, except those whose file name contains "e2e": they need the
# live testbed (make deps) and run from their own targets.
ROOT_TESTS := $(foreach f,$(sort $(wildcard tests/*.rs)),$(if $(findstring e2e,$(notdir $(f))),,--test $(basename $(notdir $(f)))))

.PHONY: build test demo bench lint deps

build:
	$(CARGO) build -j$(JOBS) --workspace

# reconcilers with its testkit (scenario files, property tests), the cocoon simulator's
# contract tests, and this package's unit and integration tests. Not the e2e harness.
test:
	$(CARGO) test -j$(JOBS) -p reconcilers --all-features
	$(CARGO) test -j$(JOBS) -p cocoon-sim
	$(CARGO) test -j$(JOBS) -p vk-cocoon --all-features --lib --bins $(ROOT_TESTS)

# For now the main job replays the committed sample journal and prints its timeline.
demo:
	$(CARGO) build -j$(JOBS) -p vk-cocoon --bin vk-cocoon
	$(TARGET_DIR)/debug/vk-cocoon replay --verify packaging/sample/demo.jsonl

bench:
	$(CARGO) bench -j$(JOBS) -p reconcilers --all-features
	$(CARGO) bench -j$(JOBS) -p vk-cocoon --bench replay

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy -j$(JOBS) --workspace --all-targets --all-features -- -D warnings

-include e2e/testbed.mk

# e2e/testbed.mk makes `deps` build the control-plane binaries; without it, do so here.
ifeq ($(wildcard e2e/testbed.mk),)
deps:
	bash e2e/scripts/build-deps.sh
endif
