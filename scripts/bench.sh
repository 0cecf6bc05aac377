#!/usr/bin/env bash
# scripts/bench.sh — `make bench`: the Go benchmarks, then the HTTP benchmarks
# (wrk against a bare fiber baseline and the gateway, interleaved, in this
# run), then the load scenarios (scripts/loadscenarios.sh: the drop at
# 100,000 shoppers over six gateways, expiry, attack; reports in out/load/),
# then the fault suite (scripts/faults.sh: out/faults/summary.json),
# recorded under out/bench/. docs/BENCHMARKS.md explains the results.
#
#   OUT=out/bench            where results go
#   BENCH_HTTP_FLAGS=...     extra flags of `flashsale-bench http` (-rounds, -duration, -users ...)
#   BENCH_WS_FLAGS=...       extra flags of `flashsale-bench ws` (-conns, -rate, -hold, -rounds ...)
#   FLASHSALE_BENCH_CONNS=N  WebSockets held by waitroom's BenchmarkConnections (default 19000:
#                            the server alone in the benchmark process, the clients in 2+ child
#                            processes of <= 9,500 each; 20,000 open files per process)
#   BENCH_DROP_ENV='...'     the drop's size (default: GATEWAYS=7 SHOPPERS=100000
#                            PROCESSES=7 SOURCE_ADDRS=120 STARTS_IN=75s DURATION=6m
#                            LOADTEST_ARGS=-preconnect=4)
#   SKIP_GO=1 / SKIP_HTTP=1 / SKIP_WS=1 / SKIP_LOAD=1 / SKIP_FAULTS=1  leave a part out
#
# Takes about 45 minutes on 2 cores (25 without the fault suite, 16 without
# the load scenarios as well; a non-root user runs the rig's gateways and
# data tier without their nice).
# Benchmarks measure; nothing here fails on a number. A benchmark that fails
# to build or run, or a load scenario whose invariants break, is recorded and
# the rest go on.
set -uo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
GO=${GO:-go}
OUT=${OUT:-out/bench}
BIN=bin/flashsale
BENCH_BIN=bin/flashsale-bench
mkdir -p "$OUT"
rm -f "$OUT"/summary.txt "$OUT"/failures.txt
[ -n "${SKIP_GO:-}" ] || rm -f "$OUT"/go-*.txt
[ -n "${SKIP_HTTP:-}" ] || rm -f "$OUT"/wrk-*.txt "$OUT"/http*.txt "$OUT"/server-*.log "$OUT"/*.lua
[ -n "${SKIP_WS:-}" ] || rm -f "$OUT"/ws*.txt "$OUT"/server-ws-*.log
[ -n "${SKIP_LOAD:-}" ] || rm -f "$OUT"/load-*.txt

$GO build -o "$BIN" ./cmd/flashsale && $GO build -o "$BENCH_BIN" ./cmd/flashsale-bench || exit 1

# The machine, and the load average every 5 s for the whole run (other
# engineers' tests share these cores: the numbers are only as quiet as that).
{
	echo "date:      $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
	echo "commit:    $(git rev-parse --short HEAD 2>/dev/null) (+ uncommitted changes: $(git status --porcelain 2>/dev/null | wc -l) files)"
	echo "nproc:     $(nproc)"
	echo "cpu:       $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
	echo "memory:    $(free -m | awk '/^Mem:/ {print $2 " MiB"}')"
	echo "go:        $($GO version)"
	echo "redis:     $(redis-server --version 2>/dev/null | head -1)"
	pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
	echo "postgres:  $("$pgbin"/postgres --version 2>/dev/null)"
	echo "wrk:       $(wrk -v 2>&1 | head -1)"
	echo "ulimit -n: $(ulimit -n)"
	echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$OUT/machine.txt"
cat "$OUT/machine.txt"

( while :; do echo "$(date -u +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 5; done ) > "$OUT/loadavg.txt" &
LOADPID=$!
trap 'kill "$LOADPID" 2>/dev/null' EXIT

# gobench NAME PKG [go test flags...]: one package's benchmarks into go-NAME.txt.
gobench() {
	local name=$1 pkg=$2
	shift 2
	if ! ls "$pkg"/*_test.go >/dev/null 2>&1 || ! grep -qs '^func Benchmark' "$pkg"/*_test.go; then
		echo "== $name: no benchmarks in $pkg, skipped" | tee -a "$OUT/failures.txt"
		return
	fi
	echo "== $name ($pkg) load $(cut -d' ' -f1-3 /proc/loadavg)"
	if ! $GO test -run '^$' -count=1 -benchmem "$@" "./$pkg/" > "$OUT/go-$name.txt" 2>&1; then
		echo "== $name: FAILED (see $OUT/go-$name.txt)" | tee -a "$OUT/failures.txt"
	fi
	grep -E '^(Benchmark|ok|FAIL|---)' "$OUT/go-$name.txt"
}

if [ -z "${SKIP_GO:-}" ]; then
	gobench admission admission -bench .
	gobench auth      auth      -bench .
	gobench defense   defense   -bench .
	gobench gateway   gateway   -bench .
	gobench stock     internal/adapter/redisstock -bench 'ReserveScript|ReservePipelined' -benchtime 3s -count 3
	gobench kafka     internal/adapter/kafka -bench .
	gobench purchase  purchase  -bench . -benchtime 3s
	gobench writer    writer    -bench . -benchtime 3x -timeout 20m
	gobench waitroom-join waitroom -bench 'Join|Permute'
	if grep -qs 'FLASHSALE_BENCH_CONNS' waitroom/*_test.go; then
		FLASHSALE_BENCH_CONNS=${FLASHSALE_BENCH_CONNS:-19000} \
			gobench waitroom-conns waitroom -bench Connections -benchtime 20x -timeout 10m
	fi
fi

if [ -z "${SKIP_HTTP:-}" ]; then
	echo "== HTTP (wrk) load $(cut -d' ' -f1-3 /proc/loadavg)"
	# shellcheck disable=SC2086
	if ! "$BENCH_BIN" http --out "$OUT" ${BENCH_HTTP_FLAGS:-} 2>&1 | tee "$OUT/http-progress.txt"; then
		echo "== http: FAILED (see $OUT/http-progress.txt, $OUT/server-*.log)" | tee -a "$OUT/failures.txt"
	fi
fi

if [ -z "${SKIP_WS:-}" ]; then
	# As the load rig runs its gateways: GOGC=300 unless the caller says.
	echo "== WebSocket shoppers load $(cut -d' ' -f1-3 /proc/loadavg)"
	# shellcheck disable=SC2086
	if ! GOGC=${GOGC:-300} "$BENCH_BIN" ws --out "$OUT" ${BENCH_WS_FLAGS:-} 2>&1 | tee "$OUT/ws-progress.txt"; then
		echo "== ws: FAILED (see $OUT/ws-progress.txt, $OUT/server-ws-*.log)" | tee -a "$OUT/failures.txt"
	fi
fi

if [ -z "${SKIP_LOAD:-}" ]; then
	# Each scenario on a fresh multi-process stack; the rig's own summary
	# lines (sell-out, persistence, steps, invariants) land in out/load/S.txt.
	echo "== load: drop load $(cut -d' ' -f1-3 /proc/loadavg)"
	# shellcheck disable=SC2086
	if ! env ${BENCH_DROP_ENV:-GATEWAYS=7 SHOPPERS=100000 PROCESSES=7 SOURCE_ADDRS=120 STARTS_IN=75s DURATION=6m LOADTEST_ARGS=-preconnect=4} \
		BUILD=0 scripts/loadscenarios.sh drop > "$OUT/load-drop.txt" 2>&1; then
		echo "== load drop: FAILED (see $OUT/load-drop.txt)" | tee -a "$OUT/failures.txt"
	fi
	echo "== load: expiry, attack load $(cut -d' ' -f1-3 /proc/loadavg)"
	if ! BUILD=0 scripts/loadscenarios.sh expiry attack > "$OUT/load-expiry-attack.txt" 2>&1; then
		echo "== load expiry/attack: FAILED (see $OUT/load-expiry-attack.txt)" | tee -a "$OUT/failures.txt"
	fi
fi

if [ -z "${SKIP_FAULTS:-}" ]; then
	echo "== faults: load $(cut -d' ' -f1-3 /proc/loadavg)"
	if ! BUILD=0 scripts/faults.sh > "$OUT/faults.txt" 2>&1; then
		echo "== faults: FAILED (see $OUT/faults.txt)" | tee -a "$OUT/failures.txt"
	fi
fi

{
	cat "$OUT/machine.txt"
	echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
	echo
	echo "Go benchmarks (full output: $OUT/go-*.txt)"
	grep -hE '^Benchmark' "$OUT"/go-*.txt 2>/dev/null
	[ -f "$OUT/http.txt" ] && cat "$OUT/http.txt"
	[ -f "$OUT/ws.txt" ] && cat "$OUT/ws.txt"
	echo
	echo "Comparisons (medians of this run)"
	# metric FILE PATTERN UNIT: the median of UNIT values of benchmark lines matching PATTERN.
	metric() {
		grep -hE "$2" "$1" 2>/dev/null | awk -v u="$3" '{for (i = 2; i <= NF; i++) if ($i == u) print $(i-1)}' |
			sort -g | awk '{a[NR] = $1} END {if (NR) print (NR % 2 ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2)}'
	}
	script=$(metric "$OUT/go-stock.txt" '^BenchmarkReserveScript' ops/s)
	pipelined=$(metric "$OUT/go-stock.txt" '^BenchmarkReservePipelined' ops/s)
	service=$(metric "$OUT/go-purchase.txt" '^BenchmarkServiceReserveInStock' ops/s)
	instock=$(awk '$1 == "in-stock" {print $2}' "$OUT/http-medians.txt" 2>/dev/null)
	base=$(awk '$1 == "baseline" {print $2}' "$OUT/http-medians.txt" 2>/dev/null)
	ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a != "" && b != "" && b > 0) printf "%.1f%%", 100 * a / b; else print "n/a"}'; }
	echo "  in-stock over HTTP ${instock:-n/a} req/s = $(ratio "$instock" "$base") of the bare fiber baseline (${base:-n/a}),"
	echo "    $(ratio "$instock" "$script") of the reserve script driven straight at Redis (${script:-n/a} calls/s, 64 goroutines),"
	echo "    $(ratio "$instock" "$service") of purchase.Service.Reserve with a kfake publish (${service:-n/a} ops/s)"
	echo "  reserve calls in shared pipelines ${pipelined:-n/a} calls/s = $(ratio "$pipelined" "$script") of the same calls one round trip each"
	for v in fsync-off fsync-off-synccommit-on durable; do
		w=$(metric "$OUT/go-writer.txt" "^BenchmarkWriter10k/$v-[0-9]+[[:space:]]" orders/s)
		[ -n "$w" ] && echo "  writer 10k orders Kafka -> committed rows ($v): $w orders/s (goal >= 15000: $(awk -v w="$w" 'BEGIN {print (w >= 15000 ? "met" : "missed")}'))"
	done
	for v in unnest copy-temp; do
		r=$(metric "$OUT/go-writer.txt" "^BenchmarkRawBatchedInsert/$v-[0-9]+[[:space:]]" orders/s)
		[ -n "$r" ] && echo "  raw batched pgx insert ($v): $r orders/s"
	done
	wconns=$(metric "$OUT/go-waitroom-conns.txt" '^BenchmarkConnections' conns)
	if [ -n "$wconns" ]; then
		wheap=$(metric "$OUT/go-waitroom-conns.txt" '^BenchmarkConnections' heap-B/conn)
		wstack=$(metric "$OUT/go-waitroom-conns.txt" '^BenchmarkConnections' stack-B/conn)
		wrss=$(metric "$OUT/go-waitroom-conns.txt" '^BenchmarkConnections' rss-B/conn)
		wp50=$(metric "$OUT/go-waitroom-conns.txt" '^BenchmarkConnections' push-p50-ms)
		wmean=$(metric "$OUT/go-waitroom-conns.txt" '^BenchmarkConnections' ms/push-all)
		wjoin=$(metric "$OUT/go-waitroom-join.txt" '^BenchmarkJoin' joins/s/core)
		goal() { awk -v v="$1" -v g="$2" 'BEGIN {print (v != "" && v <= g ? "met" : "missed")}'; }
		echo "  waitroom, $wconns WebSockets in one process: heap $wheap + stacks $wstack B/conn, RSS $wrss B/conn (goal <= 10240: $(goal "$wrss" 10240));"
		echo "    push one status to all: median $wp50 ms, mean $wmean ms (goal <= 250: $(goal "$wp50" 250)); joins ${wjoin:-n/a}/s/core"
	fi
	for sc in drop expiry attack; do
		[ -z "${SKIP_LOAD:-}" ] && [ -s "out/load/$sc.txt" ] || continue
		echo
		echo "Load scenario $sc (out/load/$sc.json, .html):"
		grep -hE '^(shoppers|reserved|first/last|PostgreSQL|redis|cpu|invariant)' "out/load/$sc.txt" | sed 's/^/  /'
	done
	if [ -z "${SKIP_FAULTS:-}" ] && [ -s out/faults/summary.json ]; then
		echo
		echo "Fault suite (out/faults/summary.json):"
		tail -n "$(jq length out/faults/summary.json)" "$OUT/faults.txt" | sed 's/^/  /'
	fi
	[ -s "$OUT/failures.txt" ] && { echo; echo "Failures / skipped:"; cat "$OUT/failures.txt"; }
} > "$OUT/summary.txt"
echo
echo "summary: $OUT/summary.txt"
if grep -qs FAILED "$OUT/failures.txt"; then exit 1; fi
