# flashsale — `make run` starts the whole stack with a demo sale; `make test`
# runs every test (race detector on). See README.md.
GO        ?= go
PKGS      ?= ./...
# Run a second time on a local 3-master Redis Cluster (testenv): every
# package that owns a Redis script, and of the whole-stack tests the ones
# that drive each family of scripts through gateways on the cluster
# (reserve, pay and cancel, contention, the draw and first wave, holds,
# item choice, returned units, added stock, pause and end, push
# subscriptions, the blocklist's fan-out, order events). The rest of
# internal/wiring is about HTTP, PostgreSQL, Kafka and settings, which a
# cluster does not change, and on the cluster every test runs alone.
CLUSTER_PKGS ?= ./internal/harness/testenv/ ./internal/adapter/redisstock/ ./waitroom/ ./defense/ ./purchase/ ./reconcile/
CLUSTER_WIRING ?= ^Test(OnePurchasePerSaleThroughHTTP|PurchasePayCancelThroughHTTP|ContentionThroughHTTP|FirstWaveEndToEnd|QueueOrderDecidesWhoBuys|QueueOrderItemChoice|QueueOrderHoldIsNoOrder|ReturnedUnitsReachTheQueue|AddStockToSoldOutSale|PauseResumeThroughHTTP|EndNowThroughHTTP|PushAtTurnQueueOrder|BlocklistReachesBothGatewaysWithin2s|ShopPaymentCallback|OrderEventsEndToEnd)$$
BIN       := bin/flashsale
GOFLAGS   ?=
export GOTOOLCHAIN ?= local

.PHONY: all build run test test-short flakehunt vet fmt readme-config bench bench-go bench-load faults fuzz clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/flashsale
	$(GO) build -o bin/flashsale-bench ./cmd/flashsale-bench
	$(GO) build -o bin/flashsale-load ./cmd/flashsale-load

run: build
	./$(BIN) dev --demo

# The allocation checks the race detector cannot make (sync.Pool is
# randomised under -race), then every test under the race detector and,
# beside it, the packages that run Redis scripts again on a Redis Cluster.
# The cluster pass runs its tests one at a time (they share the cluster)
# and mostly waits on the stack it starts, so beside the main pass it adds
# little load and saves its whole length (about 5 minutes on 2 cores);
# its output (out/test-cluster.log) is printed after the main pass's.
CLUSTER_TEST = FLASHSALE_TEST_REDIS=cluster $(GO) test -race -count=1 -parallel 1 -timeout 20m $(CLUSTER_PKGS); pkgs=$$?; \
	FLASHSALE_TEST_REDIS=cluster $(GO) test -race -count=1 -parallel 1 -timeout 20m -run "$(CLUSTER_WIRING)" ./internal/wiring/ && test $$pkgs -eq 0
test: vet rules
	@# axe-core for the browser accessibility tests (static/package-lock.json).
	@if command -v npm >/dev/null; then cd static && npm ci --no-audit --no-fund --loglevel=error; else echo "npm not found: the accessibility tests will skip"; fi
	$(GO) test -count=1 -run 'Allocs' ./admission/
	@mkdir -p out
	@( { $(CLUSTER_TEST); } >out/test-cluster.log 2>&1; echo $$? >out/test-cluster.rc ) & \
	echo '$(GO) test -race -count=1 -timeout 20m $(PKGS)'; \
	$(GO) test -race -count=1 -timeout 20m $(PKGS); main=$$?; \
	wait; echo '$(CLUSTER_TEST)'; cat out/test-cluster.log; \
	test $$main -eq 0 && test "$$(cat out/test-cluster.rc)" -eq 0

# gofmt, go vet and staticcheck (pinned in go.mod as a tool dependency).
vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

# The Prometheus alert rules: syntax, and their unit tests (promtool, from
# Debian's prometheus package).
.PHONY: rules
rules:
	promtool check rules deploy/prometheus/alerts.yml
	promtool test rules deploy/prometheus/alerts_test.yml

# The edit-test loop: the unit tests, without the race detector and
# without the end-to-end, browser and load-tool packages (make test runs
# everything; CI runs make test).
SHORT_SKIP := /browsertest$$|/internal/wiring$$|/loadtest|/cmd/flashsale$$
test-short:
	$(GO) test -short -count=1 $$($(GO) list ./... | grep -Ev '$(SHORT_SKIP)')

# The flake hunt: the end-to-end and browser packages COUNT times, alone
# and next to two busy loops (scripts/flakehunt.sh; out/flakehunt/).
flakehunt:
	scripts/flakehunt.sh

fmt:
	gofmt -w $$(git ls-files '*.go')

# The README's table of settings, from the spec (internal/wiring/settings.go);
# TestREADMESettings fails when it is stale.
readme-config:
	$(GO) test -count=1 -run '^TestREADMESettings$$' ./internal/wiring/ -update-readme

# Benchmarks: Go benchmarks, then the HTTP and load scenarios with ratios
# against baselines measured in the same run. Results: docs/BENCHMARKS.md.
bench: build
	scripts/bench.sh

bench-go:
	$(GO) test -run '^$$' -bench . -benchmem -count=1 ./...

# The load scenarios alone (drop at 100,000 shoppers, expiry, attack).
bench-load: build
	SKIP_GO=1 SKIP_HTTP=1 scripts/bench.sh

# The fault suite: a drop on separate processes with one part killed in the
# middle of it, for each part (scripts/faults.sh); out/faults/summary.json.
faults: build
	BUILD=0 scripts/faults.sh

fuzz:
	scripts/fuzz.sh 10s

clean:
	rm -rf bin out
