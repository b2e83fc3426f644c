# vk-cocoon: see README.md. `make demo` is the main job, `make test` the test run.

CARGO ?= cargo
JOBS ?= 2
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)

# Root-package integration tests, except those whose file name contains "e2e": they need the
# live testbed (make deps) and run from their own targets.
ROOT_TESTS := $(foreach f,$(sort $(wildcard tests/*.rs)),$(if $(findstring e2e,$(notdir $(f))),,--test $(basename $(notdir $(f)))))

.PHONY: build test unit e2e demo demo-replay bench bench-e2e lint deps
.PHONY: bench-snapshot crash-sweep

BENCH_PODS ?= 200
CRASH_POINTS ?= 200

build:
	$(CARGO) build -j$(JOBS) --workspace

# Everything: what the tests need (packages, the Go-built control plane; a warm machine skips
# it in under a second), formatting, lints and rule citations, the unit-level suites, then the
# end-to-end suites on the real testbed.
test: deps lint unit e2e

# reconcilers with its testkit (scenario files, property tests), the cocoon simulator's
# contract tests, the cloud-hypervisor stand-in's tests, the image builder's, and this package's unit and
# integration tests that need no testbed.
unit:
	$(CARGO) test -j$(JOBS) -p reconcilers --all-features
	$(CARGO) test -j$(JOBS) -p cocoon-sim
	$(CARGO) test -j$(JOBS) -p ch-standin
	$(CARGO) test -j$(JOBS) -p vk-cocoon-image
	$(CARGO) test -j$(JOBS) -p vk-cocoon --all-features --lib --bins $(ROOT_TESTS)

# The testbed's smoke tests and the daemon end to end (kube-apiserver + etcd, the cocoon
# simulator with real guests). One test at a time: each starts its own control plane and two
# cores are not enough for several at once. `deps` builds the Go binaries once (cached).
e2e: deps
	$(CARGO) test -j$(JOBS) -p vk-cocoon-e2e -- --test-threads=1
	$(CARGO) test -j$(JOBS) -p vk-cocoon --test e2e_daemon --test e2e_rbac --test e2e_journal --test e2e_event_lane --test e2e_kubelet --test e2e_node --test e2e_top --test e2e_exec --test e2e_dashboard --test e2e_gc --test e2e_demo -- --test-threads=1
	$(CARGO) test -j$(JOBS) -p vk-cocoon --test e2e_registry --test e2e_stateful --test e2e_resume --test e2e_operator --test e2e_peer --test e2e_fork --test e2e_trust --test e2e_guest --test e2e_macos -- --test-threads=1
	$(CARGO) test -j$(JOBS) -p vk-cocoon --test e2e_identity --test e2e_tenant_snapshots --test e2e_tenant_peer --test e2e_tenant_caps --test e2e_tenant_unmanaged --test e2e_tenant_attacks --test e2e_tenant_bases --test e2e_tenant_floods --test e2e_tenant_restarts --test e2e_real_cocoon -- --test-threads=1

# The main job: a live testbed, the daemon, three sample pods going Ready (Ctrl-C ends it;
# DEMO_ONCE=1 exits once every pod is Ready).
demo: deps
	$(CARGO) build -j$(JOBS) -p vk-cocoon --bin vk-cocoon -p cocoon-sim --bin cocoon -p vk-cocoon-e2e --bin demo
	$(TARGET_DIR)/debug/demo

# Replays the committed sample journal and prints its timeline (no testbed needed).
demo-replay:
	$(CARGO) build -j$(JOBS) -p vk-cocoon --bin vk-cocoon
	$(TARGET_DIR)/debug/vk-cocoon replay --verify packaging/sample/demo.journal

# BENCH_PODS pods at once on the simulator: create→Ready, writes per pod, RSS/CPU, vanish
# latency; fails only if the node Lease misses a renewal. Then BENCH_MIX (50+50) run-mode and
# clone-mode pods at once on BACKEND: `sim` (the default) or `real`, the reference cocoon over
# the cloud-hypervisor stand-in on a CNI network (TESTBED_COCOON=real; root): create → VM
# running and → Ready p50/p99 per mode, and where the time goes. The first part drives the
# simulator's own verbs, so BACKEND=real runs only the second (docs/benchmarks.md).
BACKEND ?= sim
BENCH_MIX ?= 50+50
bench-e2e: deps
ifeq ($(BACKEND),sim)
	BENCH_PODS=$(BENCH_PODS) $(CARGO) test -j$(JOBS) -p vk-cocoon --test bench_e2e -- --ignored --nocapture
endif
	TESTBED_COCOON=$(BACKEND) BENCH_MIX=$(BENCH_MIX) $(CARGO) test -j$(JOBS) -p vk-cocoon --test bench_backends_e2e -- --ignored --nocapture

# Every figure of the scale goals in one table, release build: BENCH_ALL_PODS (1000) pods at
# once on the testbed with zero-boot VMs whose guests share one simulator process (mass
# create, the daemon's own share of create → Ready in µs, steady-state CPU, RSS, journal
# growth and /metrics time, VM vanished → Failed), then replay --verify of a synthetic
# 1,000-pod journal and of the run's own. About 10 minutes on 2 cores, plus the first release
# build (~6 minutes).
.PHONY: bench-all
BENCH_ALL_PODS ?= 1000
bench-all: deps
	BENCH_PODS=$(BENCH_ALL_PODS) $(CARGO) test -j$(JOBS) --release -p vk-cocoon --test bench_e2e -- --ignored --nocapture

# What a fleet costs the apiserver, as the apiserver counts it: FLEET_NODES daemons on one
# testbed, each a node with its own simulator root and node identity, FLEET_PODS pods pinned
# to each. Idle, mass create until every pod is Ready, steady state, delete until every pod is
# gone (FLEET_STEADY_SECS, 60, per steady window); per node: requests per minute by kind
# (attributed by API Priority and Fairness), watch events and bytes, pod writes per pod
# lifecycle beside a kubelet's, then the extrapolation to 5,000 hosts × 100 pods
# (docs/bench-fleet.md). Release build; about 5 minutes at 20 × 50 on 2 cores, plus the first
# release build (~6 minutes).
.PHONY: bench-fleet
FLEET_NODES ?= 20
FLEET_PODS ?= 50
bench-fleet: deps
	FLEET_NODES=$(FLEET_NODES) FLEET_PODS=$(FLEET_PODS) $(CARGO) test -j$(JOBS) --release -p vk-cocoon --test bench_fleet_e2e -- --ignored --nocapture

# BENCH_FOLLOWERS (100) `logs -f` clients on one node while lines are appended and pods are
# created: the daemon's RSS and CPU, line delivery latency, create → Ready with and without
# them (figures in docs/bench-logs.md). About 2 minutes.
.PHONY: bench-logs
BENCH_FOLLOWERS ?= 100
bench-logs: deps
	BENCH_FOLLOWERS=$(BENCH_FOLLOWERS) $(CARGO) test -j$(JOBS) -p vk-cocoon --test bench_logs_e2e -- --ignored --nocapture

# Push and pull of a 1 GiB snapshot through the loopback registry: MiB/s against cp of the same
# bytes, RSS growth of the transferring process (figures in docs/bench-snapshot.md).
bench-snapshot: deps
	$(CARGO) test -j$(JOBS) --release -p vk-cocoon --test bench_snapshot_e2e -- --ignored --nocapture

# The crash sweep: one testbed with the registry, a handful of pods cycling through create,
# delete, eviction, hibernate and wake, and the daemon killed with SIGKILL CRASH_POINTS times
# (200) at seeded random moments, then restarted; after each restart every pod must converge
# within 10 s, with no VM leaked or duplicated and no snapshot lost; then replay --verify of
# the journal. One progress line per kill point; about 8 minutes for 200 points on 2 cores.
# CRASH_SEED=<n> repeats a run's choices (figures in docs/crash-sweep.md).
crash-sweep: deps
	CRASH_POINTS=$(CRASH_POINTS) $(CARGO) test -j$(JOBS) -p vk-cocoon --test crash_sweep_e2e -- --ignored --nocapture

# What is shipped. `make dist`: the static (musl) binary, stripped, its debug information
# beside it in $(TARGET_DIR)/dist (packaging/dist.sh; cold ~8 min). `make image`: the daemon's
# OCI image from it, without a container engine (packaging/image): an OCI layout archive that
# `ctr -n k8s.io images import` loads as localhost/vk-cocoon:<version>, the image
# packaging/daemonset.yaml runs; IMAGE_PUSH=<registry>/<repo>:<tag> also pushes it
# (REGISTRY_USERNAME/REGISTRY_PASSWORD log in; IMAGE_INSECURE=1 for plain HTTP).
# `make deb`: a Debian package of the stripped binary, the systemd unit and the env file, and
# a -dbgsym package of its debug information by build id, with cargo-deb (installed on first
# use, ~3 min).
.PHONY: dist image deb
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
CARGO_DEB_VERSION ?= 3.8.0
dist:
	JOBS=$(JOBS) bash packaging/dist.sh
image: dist
	$(CARGO) run -j$(JOBS) -q -p vk-cocoon-image --bin oci-image -- --binary $(TARGET_DIR)/dist/vk-cocoon \
		--out $(TARGET_DIR)/image/vk-cocoon-$(VERSION).oci.tar \
		$(if $(IMAGE_PUSH),--push $(IMAGE_PUSH)) $(if $(IMAGE_INSECURE),--insecure)
deb: dist
	@command -v cargo-deb >/dev/null || { echo "[deb] installing cargo-deb $(CARGO_DEB_VERSION) (~3 min, once)"; \
		$(CARGO) install -j$(JOBS) --locked cargo-deb --version $(CARGO_DEB_VERSION); }
	rm -rf $(TARGET_DIR)/debian
	$(CARGO) deb --no-build --target x86_64-unknown-linux-musl --dbgsym --compress-debug-symbols=zlib \
		-p vk-cocoon --output $(TARGET_DIR)/debian/
	@ls -l $(TARGET_DIR)/debian/

# The shipped artifacts as a user gets them: `make image` pushes to a testbed registry and the
# image is pulled back and its binary run; the package installs into a scratch root
# (tests/e2e_packaging.rs). Needs the release build: ~12 min cold, ~1 min warm.
.PHONY: e2e-packaging
e2e-packaging: deps deb
	$(CARGO) test -j$(JOBS) -p vk-cocoon --test e2e_packaging -- --ignored --test-threads=1

bench:
	$(CARGO) bench -j$(JOBS) -p reconcilers --all-features
	$(CARGO) bench -j$(JOBS) -p vk-cocoon --bench replay
	$(CARGO) bench -j$(JOBS) -p vk-cocoon --bench replay_html

# 1,000 loopback guests (127.1.x.y) pinged once a second through the ICMP probe path: CPU per
# round and reply latency (docs/bench-probes.md). The raw rows need root or CAP_NET_RAW.
.PHONY: bench-probes
bench-probes:
	$(CARGO) bench -j$(JOBS) -p vk-cocoon --bench probes

# Every fuzz target in e2e/fuzz (the parsers of untrusted input) for FUZZ_SECONDS each, one
# job: about 7 minutes at the default 60 s, plus ~15 minutes for the first nightly build.
# Fails on the first finding and names its input (under $(TARGET_DIR)/fuzz/artifacts). The
# grown corpus stays in $(TARGET_DIR)/fuzz/corpus; the committed seeds are only read.
.PHONY: fuzz
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := annotations quantity_time cocoon_json lease_file journal_record kubelet_query
FUZZ_WORK := $(abspath $(TARGET_DIR))/fuzz
fuzz:
	@$(CARGO) +nightly --version >/dev/null 2>&1 || { echo "make fuzz needs a nightly toolchain: rustup toolchain install nightly"; exit 1; }
	@$(CARGO) +nightly fuzz --version >/dev/null 2>&1 || { echo "make fuzz needs cargo-fuzz: cargo install cargo-fuzz"; exit 1; }
	CARGO_BUILD_JOBS=$(JOBS) $(CARGO) +nightly fuzz build --fuzz-dir e2e/fuzz --sanitizer none
	@for t in $(FUZZ_TARGETS); do \
		mkdir -p $(FUZZ_WORK)/corpus/$$t $(FUZZ_WORK)/artifacts/$$t || exit 1; \
		echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
		CARGO_BUILD_JOBS=$(JOBS) $(CARGO) +nightly fuzz run --fuzz-dir e2e/fuzz --sanitizer none $$t \
			$(FUZZ_WORK)/corpus/$$t $(CURDIR)/e2e/fuzz/corpus/$$t -- \
			-max_total_time=$(FUZZ_SECONDS) -artifact_prefix=$(FUZZ_WORK)/artifacts/$$t/ \
			-print_final_stats=1 || { echo "fuzz: $$t found a failing input; see above"; exit 1; }; \
	done

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy -j$(JOBS) --workspace --all-targets --all-features -- -D warnings
	bash docs/check-rule-ids.sh
	python3 docs/check-module-cycles.py
	python3 docs/check-sizes.py

-include e2e/testbed.mk

# e2e/testbed.mk makes `deps` build the control-plane binaries; without it, do so here.
ifeq ($(wildcard e2e/testbed.mk),)
deps:
	bash e2e/scripts/build-deps.sh
endif
