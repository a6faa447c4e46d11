# cubicle — build, test and run. Everything here works on a fresh Debian 12
# machine as root: missing packages are installed by scripts/deps.sh.

# bash: recipes use pipefail, so that go test's status survives its pipe.
SHELL     := /bin/bash
GO        ?= go
BIN       := bin
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X main.version=$(VERSION)
IMAGE_DIR ?= /var/lib/cubicle/images
FUZZTIME  ?= 10s
SOAK_SANDBOXES ?= 10
SOAK_DURATION  ?= 30m
CRASH_ROUNDS   ?= 50
# make test's repetitions, where fewer prove what more do (README,
# "Tests"): pause cycles a backend (2: the second resume is the E2B #884
# check; fewer are raised to 2), crash rounds (4: one kill during each of
# create, destroy, pause and resume), TestCrashFork's fork and snapshot
# rounds, TestFork's forks (two already show each fork its own identity),
# and the cluster tests' sandboxes (3: one a node). make e2e and a plain go
# test run the long forms: 50 cycles, 12 rounds, 4 and 3 crash-fork
# rounds, 5 forks, 9 cluster sandboxes; make crash 50 rounds.
TEST_PAUSE_CYCLES ?= 2
TEST_CRASH_ROUNDS ?= 4
TEST_CRASH_FORK_ROUNDS ?= 2
TEST_CRASH_SNAPSHOT_ROUNDS ?= 2
TEST_FORKS ?= 2
TEST_CLUSTER_SANDBOXES ?= 3
# Tools the lint runs, installed once per version into TOOLS_DIR (not
# rebuilt by `go run` on every run).
STATICCHECK_VERSION := v0.8.2
TOOLS_DIR ?= $(HOME)/.cache/cubicle/tools
# Keyed by the Go release too: a staticcheck built by an older Go cannot
# load packages that need a newer one.
STATICCHECK := $(TOOLS_DIR)/staticcheck-$(STATICCHECK_VERSION)-$(shell $(GO) env GOVERSION)/staticcheck
# The test packages that start sandboxes, VMs or image builds, or change
# the host's network (netpool, drivertest), and the cluster's simulation
# of 100 nodes on short leases: run one at a time (the niced fuzzing
# beside them takes only the CPU they leave), so that a 2-core host does
# not turn their timing into flakes. Every other package runs side by
# side (go test's default -p, the number of cores).
SANDBOX_PKGS := ./test/e2e ./test/security ./internal/driver/oci ./internal/driver/qemu ./internal/driver/drivertest \
	./internal/driver/firecracker ./internal/image ./internal/netpool ./internal/cluster \
	./examples/anthropic ./examples/openai
ART := $(CURDIR)/test-artifacts
# What the tests run: the binaries `make build` made for this commit
# (test/harness takes them from CUBICLE_TEST_BIN instead of linking its
# own in every test process).
TEST_ENV := CUBICLE_TEST_BIN=$(CURDIR)/$(BIN) CUBICLE_E2E_PAUSE_CYCLES=$(TEST_PAUSE_CYCLES) \
	CUBICLE_CRASH_ROUNDS=$(TEST_CRASH_ROUNDS) CUBICLE_CRASH_FORK_ROUNDS=$(TEST_CRASH_FORK_ROUNDS) \
	CUBICLE_CRASH_SNAPSHOT_ROUNDS=$(TEST_CRASH_SNAPSHOT_ROUNDS) CUBICLE_E2E_FORKS=$(TEST_FORKS) \
	CUBICLE_E2E_CLUSTER_SANDBOXES=$(TEST_CLUSTER_SANDBOXES)

export CUBICLE_IMAGE_DIR := $(IMAGE_DIR)

.PHONY: all build deps image run test unit unit-light unit-sandbox e2e security soak crash fuzz bench bench-pause bench-pool bench-fork bench-screenshot bench-agent-step bench-computer bench-images bench-template bench-idle bench-runsc bench-cluster lint proto clean fuzz-ci

all: build

deps:
	./scripts/deps.sh

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/cubicled ./cmd/cubicled
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/cubicle ./cmd/cubicle
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/cubicle-agent ./cmd/cubicle-agent
	$(GO) build -o $(BIN)/testreport ./test/testreport

# image builds (or finds cached) the desktop image.
image: build
	$(BIN)/cubicle image build desktop --image-dir $(IMAGE_DIR)

# run installs what is missing, builds, starts cubicled and runs the demo.
run: deps image
	./scripts/demo.sh

# test is the full suite: lint, unit (with the dependency check,
# test/depcheck), agent-on-Xvfb integration, end-to-end on the real image
# with gvisor, runc and qemu, and short fuzz runs. scripts/test.sh runs
# each step timed and writes test-artifacts/summary.md (the steps, every
# package's time, the slowest tests) whether the run passed or not; go
# test's events are kept in test-artifacts/go-test-*.json.
test:
	./scripts/test.sh

# unit runs every test package once, those that start no sandbox side by
# side first, then the others one at a time (SANDBOX_PKGS).
unit: unit-light unit-sandbox

unit-light: build
	mkdir -p $(ART)
	set -o pipefail; $(TEST_ENV) $(GO) test -json -count=1 -timeout 20m \
		$$($(GO) list ./... | grep -v -x -F $(foreach p,$(SANDBOX_PKGS),-e $(patsubst ./%,github.com/cubicle-dev/cubicle/%,$(p)))) \
		| $(BIN)/testreport stream -json $(ART)/go-test-light.json

# The end-to-end package alone took 62 min on a 2-core machine (80m keeps
# a slow one from panicking at the package timeout).
unit-sandbox: build
	mkdir -p $(ART)
	rm -rf $(ART)/liveview
	set -o pipefail; $(TEST_ENV) $(GO) test -json -p 1 -count=1 -timeout 80m $(SANDBOX_PKGS) \
		| $(BIN)/testreport stream -json $(ART)/go-test-sandbox.json
	@echo "live-view browser test screenshots (artifacts):"; ls -1 $(ART)/liveview/*.png 2>/dev/null || echo "  (none: the browser test did not run)"

# e2e runs the whole end-to-end suite; BACKEND=firecracker (on a KVM host)
# or BACKEND=qemu runs every test of it on that backend instead of
# gvisor+runc (and, for firecracker, the driver's real-VM tests).
e2e: deps image
	CUBICLE_TEST_BIN=$(CURDIR)/$(BIN) BACKEND=$(BACKEND) CUBICLE_E2E_BACKEND=$(BACKEND) $(GO) test -p 1 -count=1 -timeout 90m -v ./test/e2e/... \
		$(if $(filter firecracker,$(BACKEND)),./internal/driver/firecracker/...)

# security is the security suite on its own (make test runs it too): every
# route of the native and E2B APIs attacked from outside (test/security),
# and sandboxes attacking the daemon, the host, each other and the cloud
# metadata address inside a network namespace the test makes
# (test/e2e TestNetwork).
security: deps image
	CUBICLE_TEST_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 30m -v ./test/security/
	CUBICLE_TEST_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 30m -run '^TestNetwork$$' -v ./test/e2e/

# soak runs SOAK_SANDBOXES desktops for SOAK_DURATION under injected faults
# (test/soak), then audits the host; the report goes to
# test-artifacts/soak.md and its section of BENCHMARKS.md. Not part of make
# test: it takes half an hour.
soak: deps image
	mkdir -p test-artifacts
	CUBICLE_TEST_BIN=$(CURDIR)/$(BIN) $(GO) run ./test/soak -sandboxes $(SOAK_SANDBOXES) -duration $(SOAK_DURATION) -out test-artifacts/soak.md -benchmarks BENCHMARKS.md

# crash kills cubicled 50 times at points of creates, destroys, pauses and
# resumes (test/e2e TestCrashRestart; make test runs 4 rounds, one a kind)
# and writes the outcome to its section of BENCHMARKS.md.
crash: deps image
	CUBICLE_TEST_BIN=$(CURDIR)/$(BIN) CUBICLE_CRASH_ROUNDS=$(CRASH_ROUNDS) CUBICLE_CRASH_BENCHMARKS=$(CURDIR)/BENCHMARKS.md $(GO) test -count=1 -timeout 60m -run '^TestCrashRestart$$' -v ./test/e2e/

# fuzz runs the targets in two shards side by side, one worker each, so
# that each target's fixed cost (its instrumented build, the corpus's
# baseline run) overlaps another's fuzzing: about half the wall time of one
# shard with two workers, for half the executions per target.
fuzz:
	FUZZ_SHARD=0/2 FUZZ_PARALLEL=1 ./scripts/fuzz.sh $(FUZZTIME) & first=$$!; \
	FUZZ_SHARD=1/2 FUZZ_PARALLEL=1 ./scripts/fuzz.sh $(FUZZTIME); st=$$?; \
	wait $$first || st=1; exit $$st

# fuzz-ci is make test's: a quarter of the targets, a different quarter
# each day of the year, in the same two shards, so that every target is
# fuzzed every fourth day. All 49 took make test about 10 min, most of it
# each target's instrumented build on a fresh machine; the whole suite had
# 90 min in CI. Every test run replays all the committed corpora anyway.
# make test runs it beside unit-sandbox at nice 19, FUZZTIME=30s
# (scripts/test.sh).
fuzz-ci:
	q=$$(( $$(date +%-j) % 4 )); echo "fuzz: quarter $$q of the targets today"; \
	FUZZ_SHARD=$$q/8 FUZZ_PARALLEL=1 ./scripts/fuzz.sh $(FUZZTIME) & first=$$!; \
	FUZZ_SHARD=$$((q + 4))/8 FUZZ_PARALLEL=1 ./scripts/fuzz.sh $(FUZZTIME); st=$$?; \
	wait $$first || st=1; exit $$st

bench: deps image
	$(GO) run ./test/bench -image-dir $(IMAGE_DIR) -out BENCHMARKS.md

# bench-pause measures only pause, resume and cold create of the backends
# that pause, and rewrites only that section of BENCHMARKS.md.
bench-pause: deps image
	$(GO) run ./test/bench -image-dir $(IMAGE_DIR) -out BENCHMARKS.md -only-pause

# bench-pool measures only create-to-ready cold and from a warm pool on
# gvisor, in one run, and rewrites only that section of BENCHMARKS.md.
bench-pool: deps image
	$(GO) run ./test/bench -image-dir $(IMAGE_DIR) -out BENCHMARKS.md -only-pool

# bench-fork measures only qemu forks of 1 and of 10, snapshots and
# creates from a snapshot, against cold creates of the same run, and
# rewrites only those sections (fork, snapshot) of BENCHMARKS.md.
bench-fork: deps image
	$(GO) run ./test/bench -image-dir $(IMAGE_DIR) -out BENCHMARKS.md -only-fork

# bench-screenshot measures only native screenshots of the busy page
# (unchanged and after a change) against scrot through exec, and
# bench-agent-step an agent's step (act + settled screenshot in one call,
# two calls, a fixed 2 s sleep) with screenshot bytes at model sizes; each
# rewrites only its section of BENCHMARKS.md.
bench-screenshot: deps image
	$(GO) run ./test/bench -image-dir $(IMAGE_DIR) -out BENCHMARKS.md -only-screenshot

bench-agent-step: deps image
	$(GO) run ./test/bench -image-dir $(IMAGE_DIR) -out BENCHMARKS.md -only-agent-step

# bench-computer measures both of the above in one run, as issue 13 asks.
bench-computer: deps image
	$(GO) run ./test/bench -image-dir $(IMAGE_DIR) -out BENCHMARKS.md -only-computer

# bench-images compares the desktop (XFCE) and desktop-lite images:
# create-to-ready, session shown, idle memory.
bench-images: deps image
	$(GO) run ./test/bench -image-dir $(IMAGE_DIR) -out BENCHMARKS.md -only-images

# bench-template measures an agent's first step on gvisor: create, then
# a page typed at once into Chromium's address bar shown; cold against a
# boot template's restore.
bench-template: deps image
	$(GO) run ./test/bench -image-dir $(IMAGE_DIR) -out BENCHMARKS.md -only-template

# bench-idle leaves 20, 40 and 80 XFCE desktops idle on gvisor and reads
# their cgroups' CPU and memory (about 25 minutes; it stops creating while
# less than 2 GiB of memory is left).
bench-idle: deps image
	$(GO) run ./test/bench -image-dir $(IMAGE_DIR) -out BENCHMARKS.md -only-idle

# bench-runsc measures the gvisor backend old against new in one run:
# cubicle before the runsc pin (scripts/bench-old.sh builds that commit
# and its image once, cached), on Debian's runsc, then this commit on the
# pinned one: creates, clicks, screenshots, memory, pause and resume.
bench-runsc: deps image
	old=$$(./scripts/bench-old.sh) && $(GO) run ./test/bench -image-dir $(IMAGE_DIR) -out BENCHMARKS.md -only-runsc \
		-old-bin $$old/bin -old-image-dir $$old/images -n 50 -n-create 5 -n-pause 5

# bench-cluster runs three nodes on one etcd here: the extra hop of a
# proxied screenshot and click, and creates per second at one and three
# nodes.
bench-cluster: deps image
	$(GO) run ./test/bench -image-dir $(IMAGE_DIR) -out BENCHMARKS.md -only-cluster

lint: $(STATICCHECK)
	gofmt -l . | (! grep .)
	$(GO) vet ./...
	$(STATICCHECK) ./...
	shellcheck deploy/*.sh scripts/*.sh .ci/run

$(STATICCHECK):
	mkdir -p $(@D)
	GOBIN=$(@D) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

# proto regenerates the committed agent-protocol code in proto/ with
# Debian's protoc and the Go plugins at the versions go.mod pins.
proto: deps
	GOBIN=$(CURDIR)/$(BIN)/tools $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	GOBIN=$(CURDIR)/$(BIN)/tools $(GO) install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
	PATH="$(CURDIR)/$(BIN)/tools:$$PATH" $(GO) generate ./proto

clean:
	rm -rf $(BIN)
