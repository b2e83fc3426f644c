# e2e testbed targets, included by the top-level Makefile.
#   make deps            install the harness's Debian packages and build kube-apiserver, kubectl,
#                        etcd, registry, metrics-server, the real cocoon CLI, cocoon-operator and
#                        mkfs.erofs (cached in ~/.cache/vk-cocoon)
#   make testbed-up      start the testbed in the background and print its exports:
#                          eval "$$(make -s testbed-up)"
#   make testbed-status  list testbed runs and their processes
#   make testbed-down    stop and remove everything testbed-up started
#   make e2e-real        the real-cocoon lane: the real cocoon CLI on the cloud-hypervisor stand-in
#                        (TESTBED_COCOON=real makes testbed-up and the testbed use it too)

E2E_TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),target)
TESTBED_BIN := $(E2E_TARGET_DIR)/debug/testbed

.PHONY: deps testbed-deps testbed-build testbed-up testbed-down testbed-status e2e-real

# A prerequisite-only rule, so the top-level Makefile may still give `deps` its own recipe.
deps: testbed-deps

# The Debian packages the harness runs (iproute2, ping, prometheus) and the Go-built control
# plane: a fresh machine gets them here, a warm one skips both in under a second.
testbed-deps:
	@bash e2e/scripts/ci-setup.sh >&2

testbed-build:
	@cargo build -j2 -p vk-cocoon-e2e -p cocoon-sim --bins >&2

testbed-up: testbed-deps testbed-build
	@$(TESTBED_BIN) up

testbed-status:
	@test -x $(TESTBED_BIN) || cargo build -j2 -p vk-cocoon-e2e --bin testbed >&2
	@$(TESTBED_BIN) status

# Uses the binary already built when there is one: tearing down must not depend on the tree
# compiling.
testbed-down:
	@test -x $(TESTBED_BIN) || cargo build -j2 -p vk-cocoon-e2e --bin testbed >&2
	@$(TESTBED_BIN) down

# The real-cocoon lane, alone: tests of this package in E2E_REAL_TESTS, of the root package in
# E2E_REAL_ROOT_TESTS (file names without .rs), all with TESTBED_COCOON=real so a testbed that
# asks for a cocoon host gets the real one.
E2E_REAL_TESTS := real_cocoon_network real_cocoon_lifecycle cocoon_differential differential_lifecycle differential_events
E2E_REAL_ROOT_TESTS := e2e_real_cocoon

e2e-real: deps
	TESTBED_COCOON=real cargo test -j2 -p vk-cocoon-e2e $(addprefix --test ,$(E2E_REAL_TESTS)) -- --test-threads=1
	$(if $(strip $(E2E_REAL_ROOT_TESTS)),TESTBED_COCOON=real cargo test -j2 -p vk-cocoon $(addprefix --test ,$(E2E_REAL_ROOT_TESTS)) -- --test-threads=1)
