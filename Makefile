# Sluice — make targets. `make run` starts the whole dev stack; `make test`
# runs the suite against a real redis-server and the pinned Temporal dev server.

SHELL        := /bin/bash
GO           ?= go
BIN          := $(CURDIR)/bin
TEMPORAL_CLI_VERSION := v1.5.1
TEMPORAL     := $(BIN)/temporal
export SLUICE_TEST_TEMPORAL_BIN := $(TEMPORAL)
# Under make the alert-rule tests fail, not skip, without promtool.
export SLUICE_TEST_PROMTOOL := promtool
# Under make the reverse-proxy tests (tests/proxy) fail, not skip, without
# HAProxy.
export SLUICE_TEST_HAPROXY := haproxy
HELM_VERSION := v3.22.0
HELM         := $(BIN)/helm
export SLUICE_TEST_HELM_BIN := $(HELM)

.PHONY: all build test test-short chaos proxy bench bench-go bench-targets lint run temporal helm need need-test need-cluster clean

all: build

# The version stamped into the binaries: the git tag, or the release the
# source says (pkg/version) with the commit after it; and the commit.
# `<binary> -version`, GET /healthz and sluice_build_info show them.
VERSION      ?= $(shell git describe --tags --always --dirty 2>/dev/null | grep '^v' || echo "$$(sed -n 's/^var Version = "\(.*\)"/\1/p' pkg/version/version.go)-$$(git rev-parse --short HEAD 2>/dev/null || echo dev)")
COMMIT       ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null)
LDFLAGS      := -X github.com/sluice-dev/sluice/pkg/version.Version=$(VERSION) -X github.com/sluice-dev/sluice/pkg/version.Commit=$(COMMIT)

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/sluice ./cmd/sluice-api ./cmd/sluice-keys ./cmd/sluice-usage ./cmd/sluice-worker ./cmd/llmsim ./cmd/sluice-plan ./tests/load/cmd/sluice-bench

# Release binaries: static (CGO_ENABLED=0), without local paths (-trimpath),
# stamped, for each platform, as dist/<binary>_<os>_<arch>; then a
# CycloneDX SBOM of the modules they are built from (the tool is built from
# the module proxy; without it the release goes on, saying so) and
# SHA256SUMS over everything in dist/.
RELEASE_PLATFORMS := linux/amd64 linux/arm64
RELEASE_CMDS      := sluice sluice-api sluice-worker sluice-keys sluice-usage llmsim sluice-plan
DIST              := $(CURDIR)/dist
CYCLONEDX_GOMOD   := github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@v1.10.0

.PHONY: release
release:
	@rm -rf $(DIST) && mkdir -p $(DIST)
	@for p in $(RELEASE_PLATFORMS); do os=$${p%/*}; arch=$${p#*/}; \
	  echo ">> $(VERSION) for $$os/$$arch"; \
	  for c in $(RELEASE_CMDS); do \
	    CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags "-s -w $(LDFLAGS)" \
	      -o $(DIST)/$${c}_$${os}_$${arch} ./cmd/$$c || exit 1; \
	  done; \
	done
	@$(GO) run $(CYCLONEDX_GOMOD) mod -licenses=false -json -output $(DIST)/sluice_$(VERSION).cdx.json . \
	  || echo "   no SBOM: $(CYCLONEDX_GOMOD) could not be built or run"
	@cd $(DIST) && sha256sum $$(ls | grep -v '^SHA256SUMS$$') > SHA256SUMS
	@echo ">> $(DIST):" && ls -l $(DIST)

# The image of deploy/docker/Dockerfile, stamped like the binaries and
# tagged with the version (the Helm chart's appVersion names a release's).
.PHONY: image
image:
	docker build -f deploy/docker/Dockerfile --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) -t sluice:$(VERSION) .

# Without a container engine: the image's equivalent (deploy/ociimage: the
# static sluice binary built as the Dockerfile builds it, its links, the CA
# bundle and a passwd, one layer on an empty base) written as a
# docker-loadable tarball, with its sizes printed.
.PHONY: image-oci
image-oci:
	@mkdir -p dist
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w $(LDFLAGS)" -o dist/image-sluice ./cmd/sluice
	$(GO) run ./deploy/ociimage -bin dist/image-sluice -o dist/sluice-image.tar -tag sluice:$(VERSION)

# The Temporal CLI (Server 1.29, UI 2.42) is built from the Go module proxy;
# the first build takes ~6 minutes, later ones come from the Go build cache.
temporal: $(TEMPORAL)
$(TEMPORAL):
	@mkdir -p $(BIN)
	@echo ">> building Temporal CLI $(TEMPORAL_CLI_VERSION) into $(BIN) (first time ~6 min; progress below)"
	@( while sleep 30; do echo "   ... still building temporal CLI ($$(date +%T))"; done ) & ticker=$$!; \
	GOBIN=$(BIN) $(GO) install github.com/temporalio/cli/cmd/temporal@$(TEMPORAL_CLI_VERSION); rc=$$?; \
	kill $$ticker 2>/dev/null; exit $$rc
	@$(TEMPORAL) --version

# Helm, for `go test ./deploy/` (helm lint and helm template of
# deploy/helm/sluice); built from the Go module proxy like the Temporal CLI
# (first build a few minutes, later ones from the Go build cache).
helm: $(HELM)
$(HELM):
	@mkdir -p $(BIN)
	@echo ">> building helm $(HELM_VERSION) into $(BIN) (first time a few min; progress below)"
	@( while sleep 30; do echo "   ... still building helm ($$(date +%T))"; done ) & ticker=$$!; \
	GOBIN=$(BIN) $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION); rc=$$?; \
	kill $$ticker 2>/dev/null; exit $$rc
	@$(HELM) version --short

# What the stack needs: Go as new as go.mod's, redis-server, and for
# `make test` node/npm (the openai SDK tests). Missing ones are installed
# with apt-get when run as root or with password-less sudo, otherwise one
# line says what to run. Silent when all is there. See deploy/dev/need.sh.
need:
	@GO=$(GO) deploy/dev/need.sh go redis
need-test:
	@GO=$(GO) deploy/dev/need.sh go redis node promtool haproxy
# make test-cluster, bench-cluster and run-cluster also need PostgreSQL,
# the real Temporal server's database.
need-cluster:
	@GO=$(GO) deploy/dev/need.sh go redis postgres

# The mixed-load healing test measures latency, so it runs after the race
# run, alone and without the race detector (its file is built !race).
test: need-test $(TEMPORAL) $(HELM)
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 15m ./...
	$(GO) test -count=1 -timeout 10m -v -run TestHealingUnderMixedLoad ./tests/load/heal/

# Real faults against the real stack on loopback, every scenario
# (docs/faults.md; about 4 minutes): a killed worker, Redis restarted
# empty and stalled, a restarted dev server, hung backends, 1,000 clients
# hanging up, a client that stops reading. Writes tests/load/report/chaos.md.
# Then the reverse-proxy scenarios (make proxy). `make test` runs the fast
# subset of both.
chaos: need $(TEMPORAL)
	SLUICE_CHAOS=all $(GO) test -count=1 -timeout 30m -v ./tests/chaos/
	@$(MAKE) --no-print-directory proxy

# Sluice behind a real HAProxy started by the test, with api.trusted_proxies
# naming it (about 5 minutes): 2,000 SSE clients from their own addresses
# through it, and a client forging X-Forwarded-For.
proxy: $(TEMPORAL)
	@GO=$(GO) deploy/dev/need.sh go redis haproxy
	SLUICE_CHAOS=all $(GO) test -count=1 -timeout 15m -v ./tests/proxy/

# Unit tests only: no Temporal dev server.
test-short: need
	$(GO) test -race -count=1 -short ./...

# Benchmarks: Go micro-benchmarks, then every sluice-bench scenario, one
# after another (each starts its own redis-server, dev server and
# simulator; see docs/performance.md). `make bench-<scenario>` runs one;
# the scenarios' targets (bench-overhead ... bench-fairness-1024, and
# bench-soak, which runs only on its own) are in tests/load/bench.mk,
# generated from sluice-bench's scenario list: `sluice-bench list` shows
# them, `make bench-targets` rewrites the file after a scenario changes.
# Each target writes its scenario's report under tests/load/report/ (heal,
# goodput and soak write theirs, with a CSV and a plot, themselves). Run
# them on a quiet machine.
include tests/load/bench.mk

bench: bench-go $(BENCH_TARGETS)

bench-go: need
	$(GO) test -run '^$$' -bench . -benchmem ./pkg/...

bench-targets:
	$(GO) run ./tests/load/cmd/sluice-bench list -make > tests/load/bench.mk.new && mv tests/load/bench.mk.new tests/load/bench.mk

# The direct dependencies that have a newer version, as the module proxy
# answers (go list -m -u). Informational: a proxy that cannot be reached
# leaves a module "not checked", never a failed build.
.PHONY: deps-check
deps-check:
	@echo ">> direct dependencies with a newer version (module proxy: $$($(GO) env GOPROXY))"
	@set -o pipefail; $(GO) list -m -u -e -f '{{if and (not .Main) (not .Indirect)}}{{with .Update}}{{$$.Path}} {{$$.Version}} -> {{.Version}}{{else}}{{with $$.Error}}{{$$.Path}} {{$$.Version}}: not checked ({{.Err}}){{end}}{{end}}{{end}}' all 2>&1 \
		| sed '/^$$/d' || echo "   go list could not finish; the lines above are what it could say"

lint:
	@test -z "$$(gofmt -l . | tee /dev/stderr)" || { echo "gofmt needed"; exit 1; }
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
	$(GO) run go.temporal.io/sdk/contrib/tools/workflowcheck@v0.6.0 ./workflows/...

run: need $(TEMPORAL) build
	@deploy/dev/run.sh

clean:
	rm -rf $(BIN)/sluice $(BIN)/sluice-api $(BIN)/sluice-keys $(BIN)/sluice-usage $(BIN)/sluice-worker $(BIN)/llmsim $(BIN)/sluice-plan $(BIN)/sluice-bench .data dist

# A real Temporal server for `make run-cluster` (and testenv.LaunchTemporalServer):
# the server and its SQL schema tool at the version the pinned CLI embeds,
# and the UI server the CLI embeds, each built from the Go module proxy
# (first build ~10 min for the server, a few for the rest; later ones come
# from the Go build cache). go install names a binary after its package
# directory (server, sql), so each is installed into a scratch GOBIN and
# renamed.
TEMPORAL_SERVER_VERSION := v1.29.1
TEMPORAL_UI_VERSION     := v2.42.1
TEMPORAL_SERVER   := $(BIN)/temporal-server
TEMPORAL_SQL_TOOL := $(BIN)/temporal-sql-tool
TEMPORAL_UI       := $(BIN)/temporal-ui-server

# $(call go_install_as,PACKAGE@VERSION,NAME go install gives it,DESTINATION,LABEL)
define go_install_as
	@mkdir -p $(BIN)/.gobin-$(notdir $(3))
	@echo ">> building $(4) into $(3) (progress below)"
	@( while sleep 30; do echo "   ... still building $(4) ($$(date +%T))"; done ) & ticker=$$!; \
	t0=$$(date +%s); GOBIN=$(BIN)/.gobin-$(notdir $(3)) $(GO) install $(1); rc=$$?; \
	kill $$ticker 2>/dev/null; \
	if [ $$rc -eq 0 ]; then mv -f $(BIN)/.gobin-$(notdir $(3))/$(2) $(3) && rmdir $(BIN)/.gobin-$(notdir $(3)) && \
	  echo "   $(notdir $(3)) built in $$(( $$(date +%s) - t0 ))s"; else exit $$rc; fi
endef

.PHONY: temporal-server temporal-ui run-cluster
temporal-server: $(TEMPORAL_SERVER) $(TEMPORAL_SQL_TOOL)
temporal-ui: $(TEMPORAL_UI)

$(TEMPORAL_SERVER):
	$(call go_install_as,go.temporal.io/server/cmd/server@$(TEMPORAL_SERVER_VERSION),server,$@,Temporal server $(TEMPORAL_SERVER_VERSION))
	@$@ --version
$(TEMPORAL_SQL_TOOL):
	$(call go_install_as,go.temporal.io/server/cmd/tools/sql@$(TEMPORAL_SERVER_VERSION),sql,$@,temporal-sql-tool $(TEMPORAL_SERVER_VERSION))
	@$@ --version
$(TEMPORAL_UI):
	$(call go_install_as,github.com/temporalio/ui-server/v2/cmd/server@$(TEMPORAL_UI_VERSION),server,$@,Temporal UI server $(TEMPORAL_UI_VERSION))
	@$@ --version

# The stack on real parts, on loopback: Temporal server on PostgreSQL
# (SQL visibility), the Temporal UI, a Redis Cluster of three masters and
# three replicas, two simulators, two workers and two APIs. Ctrl-C stops
# everything. See deploy/cluster/README.md.
run-cluster: need-cluster $(TEMPORAL) temporal-server temporal-ui build
	@deploy/cluster/run.sh

# Two APIs and two workers as real processes on the real Temporal server
# and the Redis Cluster: no over-admission across instances, a stream
# resumed on the other API after kill -9, a killed worker's activities
# moving to the other, two Redis master failovers (tests/multi; about
# 3.5 minutes). CI runs it (.ci/run).
.PHONY: test-cluster bench-cluster
test-cluster: need-cluster $(TEMPORAL) temporal-server build
	SLUICE_MULTI=1 $(GO) test -count=1 -timeout 20m -v ./tests/multi/

# The same closed loops through the cluster stack and through `make run`'s
# shape started beside it, one after the other (about 4 minutes); writes
# tests/load/report/cluster-goodput.md (docs/scaling.md).
bench-cluster: need-cluster $(TEMPORAL) temporal-server build
	SLUICE_MULTI=1 SLUICE_MULTI_GOODPUT=1 $(GO) test -count=1 -timeout 20m -v -run TestGoodputClusterAgainstSingle ./tests/multi/

# bench-fairness's real workload (recorded max_tokens) through the cluster
# stack, row i through API i mod 2, and straight to the same simulator
# (FCFS) in the same run (about 8 minutes); writes
# tests/load/report/fairness-cluster.md. FAIRNESS_DURATION=60 replays the
# trace's first 60 seconds (a smoke run, about 3 minutes);
# FAIRNESS_WORKLOAD=overload the other workload.
.PHONY: bench-fairness-cluster
bench-fairness-cluster: need-cluster $(TEMPORAL) temporal-server build
	SLUICE_MULTI=1 SLUICE_MULTI_FAIRNESS=1 $(if $(FAIRNESS_DURATION),SLUICE_FAIRNESS_DURATION=$(FAIRNESS_DURATION)) $(if $(FAIRNESS_WORKLOAD),SLUICE_FAIRNESS_WORKLOAD=$(FAIRNESS_WORKLOAD)) \
		$(GO) test -count=1 -timeout 30m -v -run TestFairnessClusterVTC ./tests/multi/

# deploy/grafana/preview.png: the dashboard's queries drawn from a real
# Prometheus (Debian's prometheus package) scraping a loaded stack of its
# own on free ports; Grafana itself is not installable here (~5 minutes).
# After changing deploy/grafana/dashboard.go, regenerate sluice.json with
# `go run ./cmd/sluice-dashboard json`.
# The Helm chart ships copies of the dashboard and the rules (Helm reads
# only files inside the chart); go test ./deploy/ fails when they differ.
.PHONY: chart-files
chart-files:
	$(GO) run ./cmd/sluice-dashboard json
	cp deploy/grafana/sluice.json deploy/prometheus/sluice-rules.yaml deploy/helm/sluice/files/

.PHONY: dashboard-preview
dashboard-preview: need $(TEMPORAL) build
	@GO=$(GO) deploy/dev/need.sh promtool
	$(GO) build -o $(BIN)/ ./cmd/sluice-dashboard
	deploy/grafana/preview.sh
