# Bulkhead build. Every target is plain `go`; only `image` needs Docker.
# `make help` lists the targets.

SHELL         := /bin/bash
GO            ?= go
BIN           := $(CURDIR)/bin
VERSION       ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT        ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS       := -s -w -X github.com/bulkhead-dev/bulkhead/internal/buildinfo.version=$(VERSION) \
                 -X github.com/bulkhead-dev/bulkhead/internal/buildinfo.commit=$(COMMIT)
# grpcnotrace drops grpc-go's golang.org/x/net/trace support (request traces
# served at /debug/requests, which nothing here enables); without it
# html/template and text/template come along, and their reflection keeps
# every exported method alive: the daemon is 2.8 MB smaller and its idle RSS
# 2.3 MB lower.
BUILD_TAGS    ?= grpcnotrace
TEST_FLAGS    ?=
# Code generators, pinned in tools/go.mod (a separate module so buf's
# dependency graph stays out of the main module).
GENERATORS    := $(BIN)/buf $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/protoc-gen-connect-go
# staticcheck, pinned in tools/go.mod the same way.
STATICCHECK   := $(BIN)/staticcheck

.DEFAULT_GOAL := help

.PHONY: help
help: ## list targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

.PHONY: build
# The binaries are built in a directory of their own and renamed into
# bin/: go build may rewrite an existing output in place (when it copies
# it from the build cache), and a concurrent reader (images/build.sh
# hashing the daemon while another test package's `make image` builds)
# would see half a file, take it for a new daemon and replace the image
# under a build using it.
build: ## build static binaries (CGO_ENABLED=0, -trimpath, version stamped) into bin/
	@mkdir -p $(BIN)
	@[ -x $(BIN)/harness ] || echo "make build: harness and sandbox-agentd into $(BIN)/; a first build downloads the Go modules and compiles about 700 packages, a few minutes (progress below)"
	@tmp=$$(mktemp -d $(BIN)/.build.XXXXXX) && \
	trap 'rm -rf "$$tmp"' EXIT && \
	echo "CGO_ENABLED=0 $(GO) build -trimpath -tags '$(BUILD_TAGS)' -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/harness ./cmd/sandbox-agentd" && \
	{ CGO_ENABLED=0 $(GO) build -v -trimpath -tags '$(BUILD_TAGS)' -ldflags '$(LDFLAGS)' -o "$$tmp/" ./cmd/harness ./cmd/sandbox-agentd 2>&1; \
	  echo $$? >"$$tmp/.rc"; } | $(BUILD_PROGRESS) && \
	[ "$$(cat "$$tmp/.rc")" = 0 ] && rm -f "$$tmp/.rc" && \
	mv -f "$$tmp"/* $(BIN)/

# BUILD_PROGRESS turns go build -v's list of packages being compiled (none
# when everything is cached) into one counting line on a terminal, or a
# line per 100 packages otherwise; anything else (a compile error) passes
# through as it is.
BUILD_PROGRESS := awk -v tty=$$([ -t 1 ] && echo 1 || echo 0) \
	'/^[A-Za-z0-9._~\/-]+$$/ { n++; if (tty) printf "\r  compiled %d packages", n > "/dev/stderr"; else if (n % 100 == 0) printf "  compiled %d packages\n", n > "/dev/stderr"; next } \
	 { if (tty && n) printf "\n" > "/dev/stderr"; print } \
	 END { if (n) printf "%s  compiled %d packages: done\n", (tty ? "\r" : ""), n > "/dev/stderr" }'

.PHONY: run
EXAMPLE       := examples/coding-task
TASK          ?= Open repo/task.md, fix the bug it describes, run sh tests/test_credit_note.sh from repo/ until it passes, and summarize the change.

# Local sandboxes are isolated with bubblewrap, and --isolation auto never
# falls back to plain processes: on a machine without bwrap, run asks for
# them by name (--isolation none) and says so.
run: build ## build, then run an agent on the example coding task in a local sandbox (a recorded replay without OPENAI_API_KEY)
	@command -v bwrap >/dev/null 2>&1 || echo "make run: no bubblewrap (bwrap) here, so --isolation none: the sandbox runs as plain processes that see this machine's files and network; install bubblewrap to isolate it" >&2
	$(BIN)/harness run $$(command -v bwrap >/dev/null 2>&1 || echo --isolation none) --manifest $(EXAMPLE)/manifest.yaml \
		--replay-without-key $(EXAMPLE)/replay.json --export $(CURDIR)/.run/workspace-$$(date +%s) "$(TASK)"

.PHONY: demo
demo: build ## build, then tour the daemon's API step by step (harness demo)
	$(BIN)/harness demo

$(GENERATORS): tools/go.mod tools/go.sum
	cd tools && $(GO) build -o $(BIN)/ github.com/bufbuild/buf/cmd/buf \
		google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc \
		connectrpc.com/connect/cmd/protoc-gen-connect-go
	@touch $(GENERATORS)

$(STATICCHECK): tools/go.mod tools/go.sum
	cd tools && $(GO) build -o $(BIN)/ honnef.co/go/tools/cmd/staticcheck
	@touch $@

.PHONY: generate
generate: $(GENERATORS) ## lint the protos and regenerate the committed Go code
	PATH=$(BIN):$$PATH $(BIN)/buf format -w
	PATH=$(BIN):$$PATH $(BIN)/buf lint
	PATH=$(BIN):$$PATH $(BIN)/buf generate

.PHONY: check-generated
check-generated: generate ## regenerate and fail if the committed code differs
	@if [ -n "$$(git status --porcelain -- proto)" ]; then \
		echo "generated code is stale; run 'make generate' and commit:"; git status --porcelain -- proto; git diff --stat -- proto; exit 1; fi

.PHONY: test
# -timeout: the kubernetes provider's package runs a real cluster through
# create, exec, eviction and API server restarts, past go test's default
# of 10 minutes per package on a loaded 2-core machine.
test: ## run all tests with the race detector
	$(GO) test -race -count=1 -timeout 30m $(TEST_FLAGS) ./...

.PHONY: fuzz
fuzz: ## run each fuzz target for FUZZTIME (default 30s)
	@./scripts/fuzz.sh $${FUZZTIME:-30s}

.PHONY: bench
bench: build ## measure the daemon against same-run baselines; prints a table of ratios
	CGO_ENABLED=0 $(GO) build -trimpath -tags '$(BUILD_TAGS)' -ldflags '-s -w' -o $(BIN)/grpcfloor ./cmd/bench/grpcfloor
	$(GO) run ./cmd/bench -bin $(BIN)

# Sandbox images, built locally with no registry (images/build.sh): the small
# busybox + git image and the debootstrap-based full one. Each is rebuilt only
# when its inputs (daemon binary included) changed; the debootstrap root
# filesystem is cached under ${XDG_CACHE_HOME:-$HOME/.cache}/bulkhead.
.PHONY: image image-sandbox image-sandbox-full
image: image-sandbox image-sandbox-full ## build bulkhead/sandbox:dev and bulkhead/sandbox-full:dev (needs Docker)

image-sandbox: build ## build only the small image bulkhead/sandbox:dev
	./images/build.sh sandbox

image-sandbox-full: build ## build only the debootstrap image bulkhead/sandbox-full:dev
	./images/build.sh sandbox-full

# The small image's root filesystem (busybox-static, git, GNU wget, the CA
# bundle, etc/passwd and group; no daemon, no Docker) as a directory: local sandboxes' own root
# (harness --sandbox-rootfs bin/rootfs). bin/rootfs is a symbolic link to
# bin/.rootfs-HASH, named by its contents, and changes only when they do.
.PHONY: rootfs
rootfs: ## write the sandbox root filesystem into bin/rootfs (for --sandbox-rootfs; needs busybox-static, git, wget and ca-certificates, no Docker)
	./images/build.sh rootfs $(BIN)/rootfs

# The Kubernetes cluster the kubernetes provider's tests run against
# (internal/testing/testservers/kube): kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, etcd and a NetworkPolicy enforcer built from the
# Go module proxy in one go build into the user cache directory, as the
# tests build them (about 12 CPU-minutes cold).
.PHONY: kube-tools
kube-tools: ## build the test cluster's Kubernetes, etcd and NetworkPolicy enforcer binaries into the user cache (as the tests do)
	$(GO) run ./internal/testing/testservers/kube/cmd/kubetools

.PHONY: vet
vet: ## go vet and gofmt
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)

# buf breaking compares the protos of the working tree with the last landed
# commit, to catch wire-incompatible changes (a field deleted or renumbered,
# a type changed, an RPC removed: buf.yaml's FILE rules) before they land.
# The last landed commit is origin/main where the clone has it (a CI clone,
# or a developer's clone with commits not yet pushed), else HEAD (a tree
# whose commits are made in place: its uncommitted proto edits are checked).
# Where that is the commit checked out (CI's fresh clone of main) the tree is
# compared with itself and passes: the check bites in the tree that makes
# the change, before it lands. BREAKING_AGAINST=<commit> overrides it.
BREAKING_AGAINST ?= $(shell git rev-parse --verify -q origin/main || git rev-parse --verify -q HEAD)

.PHONY: lint
lint: $(BIN)/buf $(STATICCHECK) ## gofmt, go mod tidy -diff (main module and tools/), buf breaking against the last landed commit, staticcheck
	@files=$$(git ls-files '*.go' | while read -r f; do [ -e "$$f" ] && echo "$$f"; done); \
		bad=$$(gofmt -l $$files); \
		if [ -n "$$bad" ]; then echo "gofmt: these files need formatting (gofmt -w):"; echo "$$bad"; exit 1; fi
	$(GO) mod tidy -diff
	cd tools && $(GO) mod tidy -diff
	@test -n "$(BREAKING_AGAINST)" || { echo "lint: no commit to compare the protos with (not a git clone?)"; exit 1; }
	$(BIN)/buf breaking --against '.git#ref=$(BREAKING_AGAINST)'
	$(STATICCHECK) ./...

.PHONY: clean
clean: ## remove build outputs
	rm -rf $(BIN)
