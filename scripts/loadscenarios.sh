#!/usr/bin/env bash
# Load scenarios against a real multi-process stack built from bin/flashsale,
# driven by bin/flashsale-load.
#
#   scripts/loadscenarios.sh [drop|expiry|attack|smoke ...]   (default: drop expiry attack)
#
# For each scenario a fresh stack is started under out/load/<scenario>/:
#   - `flashsale dev` (local redis-server + PostgreSQL, an embedded Kafka on a
#     fixed port, writer, expiry, and a gateway on 127.0.0.1:18080 used only
#     for the operator calls),
#   - GATEWAYS `flashsale gateway` processes (127.0.0.1:18081, …) on the
#     same Redis, PostgreSQL and Kafka, which take all the shopper traffic,
# permissive bot-defense settings are stored through PUT /api/admin/settings
# (operator token from `flashsale token --role operator`), then
# `flashsale-load --scenario S` runs over every gateway and writes
# out/load/S.json and out/load/S.html. Everything started is stopped by pid
# at the end.
#
# Environment knobs (defaults in brackets):
#   GATEWAYS [2]  SHOPPERS [scenario's]  PROCESSES [scenario's]
#   SOURCE_ADDRS [scenario's]  RATE [scenario's]  STARTS_IN [scenario's]
#   DURATION [scenario's]  QUIET_TIMEOUT [75s]  FLASHSALE_RECONCILE_AFTER [30s]
#   LOADTEST_ARGS [extra flags for flashsale-load]
#   CAPACITY_FACTOR [2]  BUILD [1: make build first]
#   GOGC [300: for every process started here]
#   GODEBUG [gcshrinkstackoff=1: for every process started here]
#   PROCS_EACH [1: GOMAXPROCS of each gateway and load process; a dozen
#   processes on 2 cores run better with one P each than with two]
#   GATEWAY_PROCS [PROCS_EACH: GOMAXPROCS of each gateway alone]
#   GATEWAY_NICE [2: the gateways run at nice -GATEWAY_NICE, a little ahead
#   of the load processes, which stand in for shoppers' own machines but
#   share the gateways' cores here, so that the orders reach PostgreSQL
#   soon after the last reservation; 0: equal turns (docs/benchmarks/load.md
#   compares the two)]
#   PROFILE [0; 1: CPU profiles of the opening, from 0.5 s before it for
#   PROFILE_SECONDS (3), of the dev process, every gateway and each load
#   worker, into out/load/<scenario>/profiles/ (go tool pprof -top FILE)]
#   DATA_NICE [10: redis-server, PostgreSQL and the dev process (Kafka,
#   writer) run at nice -10, standing in for their own machines; 0: off]
#   IDLE_WINDOW [unset; seconds: the cost of waiting. Once every shopper's
#   WebSocket is open on the gateways (the sum of their
#   flashsale_waitroom_connections reaches SHOPPERS) the script reads the
#   CPU ticks of every server process, again IDLE_WINDOW seconds later,
#   and writes out/load/<scenario>/idle.txt: µs of server CPU per waiting
#   socket per second, per role; with a CPU profile of gateway 1 over the
#   same window (idle-gateway1.pprof). Give STARTS_IN room for the joins
#   (which the load tool spreads over 80% of it unless -join-spread says)
#   and the window before the draw (FLASHSALE_DRAW_LEAD, 3 s): with the
#   shoppers in the pre-queue, nothing but the waiting happens then]
#   IDLE_DELAY [0; seconds: the IDLE_WINDOW starts this long after every
#   socket is open, over the sockets open then; with a STARTS_IN shorter
#   than the delay and LOADTEST_ARGS="-quantity 100 -keep-waiting
#   -sold-out-quiet 90s", the window falls after the sell-out, over the
#   crowd told SOLD_OUT that stays for returned units]
set -euo pipefail
cd "$(dirname "$0")/.."

SCENARIOS=("$@")
[ ${#SCENARIOS[@]} -gt 0 ] || SCENARIOS=(drop expiry attack)
GATEWAYS=${GATEWAYS:-2}
PROCS_EACH=${PROCS_EACH:-1}
GATEWAY_PROCS=${GATEWAY_PROCS:-$PROCS_EACH}
GATEWAY_NICE=${GATEWAY_NICE:-2}
BIN=./bin/flashsale
OUT=out/load
KAFKA_PORT=${KAFKA_PORT:-19092}
mkdir -p "$OUT"

if [ "${BUILD:-1}" = 1 ]; then
	make build >/dev/null
fi

# Open files: each gateway and each load worker holds one socket per
# WebSocket shopper (hard limit 20,000 here).
ulimit -n 20000 || ulimit -n "$(ulimit -Hn)"
echo "open-file limit: $(ulimit -n)"

PIDS=()
cleanup() {
	local p
	for p in "${PIDS[@]}"; do
		kill -TERM "$p" 2>/dev/null || true
	done
	for p in "${PIDS[@]}"; do
		# bounded wait: 30 s per process at most
		for _ in $(seq 1 300); do
			kill -0 "$p" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$p" 2>/dev/null || true
	done
	PIDS=()
}
trap cleanup EXIT INT TERM

# wait_url URL SECONDS: until URL answers 200.
wait_url() {
	local i
	for i in $(seq 1 $(($2 * 4))); do
		if curl -fsS -o /dev/null "$1" 2>/dev/null; then
			return 0
		fi
		sleep 0.25
	done
	echo "timeout waiting for $1" >&2
	return 1
}

# banner_value FILE LABEL: the value after LABEL in the dev banner.
banner_value() {
	local i v
	for i in $(seq 1 240); do
		v=$(awk -v l="$2" '$1 == l { print $2; exit }' "$1" 2>/dev/null || true)
		if [ -n "$v" ]; then
			echo "$v"
			return 0
		fi
		sleep 0.25
	done
	echo "no $2 in $1" >&2
	return 1
}

start_stack() { # scenario
	local s=$1 dir="$OUT/$s"
	rm -rf "$dir"
	mkdir -p "$dir"
	export FLASHSALE_JWT_SECRET="loadscenarios-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')"
	export FLASHSALE_LOG_LEVEL=${FLASHSALE_LOG_LEVEL:-warn}
	# The simulated shoppers share a few loopback addresses and warm
	# thousands of connections at once: no cap on connections before
	# their first request.
	export FLASHSALE_MAX_PENDING_CONNS_PER_ADDR=1000000
	# Every process here holds tens of thousands of connections in a few
	# hundred MB of heap and has memory to spare: collect at 4× the live
	# heap instead of 2× (GOGC=100), which halves the collector's CPU.
	export GOGC=${GOGC:-300}
	# The idle shoppers' goroutines (a room connection's reader, a load
	# shopper blocked on its WebSocket) are shrunk by each collection and
	# grow again, on fresh pages, the moment the opening wakes them all.
	export GODEBUG=${GODEBUG:-gcshrinkstackoff=1}
	export FLASHSALE_CAPACITY_FACTOR=${CAPACITY_FACTOR:-2}
	# The expiry scenario needs a short payment window; the others keep
	# the default so nothing expires during the run.
	if [ "$s" = expiry ]; then
		export FLASHSALE_PAYMENT_WINDOW=20s FLASHSALE_EXPIRY_INTERVAL=2s
	else
		unset FLASHSALE_PAYMENT_WINDOW FLASHSALE_EXPIRY_INTERVAL
	fi
	# A reservation whose publish failed or timed out is held in Redis
	# until the reconciler returns it (FLASHSALE_RECONCILE_AFTER, default
	# 2m); 30 s keeps the run's quiet wait (QUIET_TIMEOUT) short enough.
	export FLASHSALE_RECONCILE_AFTER=${FLASHSALE_RECONCILE_AFTER:-30s}
	unset FLASHSALE_REDIS_URL FLASHSALE_DATABASE_URL FLASHSALE_KAFKA_BROKERS
	$BIN dev --data-dir "$dir/data" --kafka-port "$KAFKA_PORT" \
		--http-addr 127.0.0.1:18080 --admin-addr 127.0.0.1:19080 \
		>"$dir/dev.out" 2>"$dir/dev.log" &
	PIDS+=($!)
	# The server processes whose CPU-seconds the load report counts
	# (--server-pids): dev holds the Kafka broker, the writer, expiry and
	# the operator gateway in one process.
	SERVER_PIDS="dev=$!"
	REDIS_URL=$(banner_value "$dir/dev.out" Redis)
	DATABASE_URL=$(banner_value "$dir/dev.out" PostgreSQL)
	wait_url http://127.0.0.1:19080/readyz 60
	# Shoppers go to GATEWAYS `flashsale gateway` processes; the dev
	# process (embedded Kafka broker, writer, expiry, gateway 0 for the
	# operator calls) gets no shopper traffic: with thousands of
	# WebSockets it would run out of open files and take the broker's
	# connections with it (seen with shoppers on it: every produce failed).
	URLS=""
	local g
	for g in $(seq 1 "$GATEWAYS"); do
		FLASHSALE_REDIS_URL=$REDIS_URL FLASHSALE_DATABASE_URL=$DATABASE_URL \
			FLASHSALE_KAFKA_BROKERS=127.0.0.1:$KAFKA_PORT GOMAXPROCS=$GATEWAY_PROCS \
			nice -n "-$GATEWAY_NICE" $BIN gateway --http-addr 127.0.0.1:$((18080 + g)) --admin-addr 127.0.0.1:$((19080 + g)) \
			>"$dir/gateway$g.log" 2>&1 &
		PIDS+=($!)
		SERVER_PIDS="$SERVER_PIDS,gateway=$!"
		wait_url http://127.0.0.1:$((19080 + g))/readyz 60
		URLS="${URLS:+$URLS,}http://127.0.0.1:$((18080 + g))"
	done
	echo "stack for $s: gateways $URLS, redis $REDIS_URL, postgres $DATABASE_URL, kafka 127.0.0.1:$KAFKA_PORT"
	# redis-server by its port, PostgreSQL by its postmaster (the report
	# counts its backends, live and exited).
	local rp p
	rp=${REDIS_URL##*:}
	for p in $(pgrep -f "redis-server 127.0.0.1:${rp%%/*}" || true); do
		SERVER_PIDS="$SERVER_PIDS,redis=$p"
	done
	p=$(head -n 1 "$dir/data/pg/postmaster.pid" 2>/dev/null || true)
	[ -n "$p" ] && SERVER_PIDS="$SERVER_PIDS,postgres=$p"
	echo "server pids for the CPU figures: $SERVER_PIDS"

	# The data tier (redis-server, PostgreSQL, and the dev process with the
	# Kafka broker and the writer) would have machines of its own; here it
	# shares 2 cores with a dozen gateway and load processes, and a
	# single-threaded Redis given 1/20 of a core answers in seconds. It runs
	# at nice -DATA_NICE (backends PostgreSQL forks later inherit it); the
	# gateways run at -GATEWAY_NICE, the load tool at 0. DATA_NICE=0: off.
	if [ "${DATA_NICE:-10}" != 0 ]; then
		local rport=${REDIS_URL##*:} data_pids pg_main
		rport=${rport%%/*}
		# This run's postmaster and its children only: other PostgreSQL
		# servers on the machine (a test suite's) are not ours, and one of
		# their short-lived backends exiting while its threads were listed
		# once ended this script at start (set -e). A process gone by then
		# is skipped.
		pg_main=$(head -n 1 "$dir/data/pg/postmaster.pid" 2>/dev/null || true)
		data_pids="${PIDS[0]} $(pgrep -f "redis-server 127.0.0.1:$rport" | tr '\n' ' ' || true) $pg_main"
		if [ -n "$pg_main" ]; then
			data_pids="$data_pids $(pgrep -P "$pg_main" | tr '\n' ' ' || true)"
		fi
		# Nice is per thread on Linux: renice every thread of each process
		# (the Go dev process runs the broker on threads made at start).
		local p tids=""
		for p in $data_pids; do
			tids="$tids $(ls /proc/"$p"/task 2>/dev/null | tr '\n' ' ' || true)"
		done
		# shellcheck disable=SC2086
		renice -n "-${DATA_NICE:-10}" -p $tids >/dev/null && echo "data tier at nice -${DATA_NICE:-10}: pids $data_pids"
	fi

	# Permissive bot defense: the simulated shoppers share few loopback
	# source addresses, so per-address limits would measure the tool.
	local op
	op=$($BIN token --user 1 --role operator)
	curl -fsS -X PUT -H "Authorization: Bearer $op" -H 'Content-Type: application/json' \
		--data '{"rateLimit": {"perIp": {"rps": 1000000, "burst": 1000000}, "perUser": {"rps": 1000000, "burst": 1000000}}, "pow": {"difficulty": 0}, "blocklist": {"cidrs": [], "users": []}}' \
		http://127.0.0.1:18080/api/admin/settings >"$dir/settings.json"
	sleep 3 # applied on every gateway within 2 s (CONTRACT section 3)
}

# conns_open: the sum of flashsale_waitroom_connections over the gateways.
conns_open() {
	local g n=0 v
	for g in $(seq 1 "$GATEWAYS"); do
		v=$(curl -fsS http://127.0.0.1:$((19080 + g))/metrics 2>/dev/null |
			awk '$1 == "flashsale_waitroom_connections" {printf "%d", $2}')
		n=$((n + ${v:-0}))
	done
	echo "$n"
}

# role_ticks: "role ticks" per role of SERVER_PIDS, utime + stime of each
# named process, its threads included (/proc/<pid>/stat fields 14 and 15;
# PostgreSQL: the postmaster alone, which waiting shoppers do not reach).
role_ticks() {
	local pair role pid
	local -A sum=()
	for pair in ${SERVER_PIDS//,/ }; do
		role=${pair%%=*} pid=${pair#*=}
		[ -r /proc/"$pid"/stat ] || continue
		sum[$role]=$(( ${sum[$role]:-0} + $(awk '{sub(/^.*\) /, ""); print $12 + $13}' /proc/"$pid"/stat) ))
	done
	for role in "${!sum[@]}"; do echo "$role ${sum[$role]}"; done | sort
}

# idle_sample scenario: the IDLE_WINDOW measurement (see the knobs above).
idle_sample() {
	local s=$1 want=${SHOPPERS:?IDLE_WINDOW needs SHOPPERS} n i hz
	hz=$(getconf CLK_TCK)
	for i in $(seq 1 600); do
		n=$(conns_open)
		[ "$n" -ge "$want" ] && break
		sleep 1
	done
	if [ "$n" -lt "$want" ]; then
		echo "idle: only $n of $want WebSockets open after 600 s; no measurement" | tee "$OUT/$s/idle.txt"
		return
	fi
	# IDLE_DELAY: the window starts that much later, over the sockets open
	# then (after the opening: the crowd told SOLD_OUT that stays).
	sleep "${IDLE_DELAY:-0}"
	want=$(conns_open)
	local t0 t1 before after
	before=$(role_ticks); t0=$(date +%s.%N)
	curl -fsS "http://127.0.0.1:19081/debug/pprof/profile?seconds=$IDLE_WINDOW" -o "$OUT/$s/idle-gateway1.pprof" &
	local prof=$!
	sleep "$IDLE_WINDOW"
	after=$(role_ticks); t1=$(date +%s.%N)
	wait $prof || true
	n=$(conns_open)
	{
		echo "idle window: $want WebSockets open at the start, $n at the end, $(echo "$t1 - $t0" | bc) s, load average $(cut -d' ' -f1-3 /proc/loadavg)"
		[ "$n" -ge "$want" ] || echo "INVALID: shoppers left during the window (did the draw come? give STARTS_IN more room)"
		join <(echo "$before") <(echo "$after") | awk -v hz="$hz" -v n="$want" -v w="$(echo "$t1 - $t0" | bc)" '
			{ cpu = ($3 - $2) / hz; tot += cpu
			  printf "idle %-9s %7.2f cpu-s  %8.2f µs per waiting socket per second\n", $1, cpu, cpu * 1e6 / (n * w) }
			END { printf "idle server    %7.2f cpu-s  %8.2f µs per waiting socket per second\n", tot, tot * 1e6 / (n * w) }'
	} | tee "$OUT/$s/idle.txt"
}

run_scenario() { # scenario
	local s=$1 args=()
	[ -n "${SHOPPERS:-}" ] && args+=(--shoppers "$SHOPPERS")
	[ -n "${PROCESSES:-}" ] && args+=(--processes "$PROCESSES")
	[ -n "${SOURCE_ADDRS:-}" ] && args+=(--source-addrs "$SOURCE_ADDRS")
	[ -n "${RATE:-}" ] && args+=(--rate "$RATE")
	[ -n "${STARTS_IN:-}" ] && args+=(--starts-in "$STARTS_IN")
	[ -n "${DURATION:-}" ] && args+=(--duration "$DURATION")
	args+=(--quiet-timeout "${QUIET_TIMEOUT:-75s}")
	# shellcheck disable=SC2206
	[ -n "${LOADTEST_ARGS:-}" ] && args+=(${LOADTEST_ARGS})
	if [ "${PROFILE:-0}" = 1 ]; then
		local g purls="dev=http://127.0.0.1:19080"
		for g in $(seq 1 "$GATEWAYS"); do
			purls="$purls,gateway$g=http://127.0.0.1:$((19080 + g))"
		done
		args+=(--profile-dir "$OUT/$s/profiles" --profile-urls "$purls" --profile-seconds "${PROFILE_SECONDS:-3}")
	fi
	echo "== $s  $(date -u +%FT%TZ)  load average before: $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$OUT/$s.txt"
	local rc=0 idle=""
	if [ -n "${IDLE_WINDOW:-}" ]; then
		idle_sample "$s" &
		idle=$!
	fi
	GOMAXPROCS=$PROCS_EACH ./bin/flashsale-load --scenario "$s" --url "$URLS" --admin-url http://127.0.0.1:19081 \
		--database-url "$DATABASE_URL" --redis-url "$REDIS_URL" --server-pids "$SERVER_PIDS" \
		--json "$OUT/$s.json" --html "$OUT/$s.html" "${args[@]}" \
		> >(tee -a "$OUT/$s.txt") 2> >(tr '\r' '\n' | tail -n 40 >>"$OUT/$s.progress") || rc=$?
	[ -n "$idle" ] && { wait "$idle" || true; }
	echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg); exit $rc" | tee -a "$OUT/$s.txt"
	local g
	for g in $(seq 0 "$GATEWAYS"); do
		curl -fsS http://127.0.0.1:$((19080 + g))/metrics >"$OUT/$s/metrics-gateway$g.txt" 2>/dev/null || true
	done
	if [ -s "$OUT/$s.json" ] && command -v jq >/dev/null; then
		jq -r '"shoppers \(.shoppers) over \(.config.baseUrls | length + 1) gateways, \(.processes) load processes, quantity \(.orders.quantity)",
			"reserved \(.orders.reserved)  sold \(.orders.sold)  paid \(.orders.paid)  expired \(.orders.expired)  remaining \(.orders.remaining)  stopped \(.stopped)",
			"first/last reservation \(.firstReservationMs)/\(.lastReservationMs) ms after opening, first sold-out seen \(.sellOutMs) ms, admissions \(.admissionsPerSecond | floor)/s",
			"allocation \(.allocation // "?"): last unit given (held or reserved, server time, order ids) \(.allocationMs // "?") ms after opening; purchase 503s \([.steps.purchase.outcomes // {} | to_entries[] | select(.key | startswith("503")) | .value] | add // 0)",
			"PostgreSQL: \(.persist.rows // "?") rows; all reserved orders in at \(.persist.allPersistedMs // "?") ms after opening: \(.persist.lagAfterLastCreatedMs // "?") ms after the last reservation (server time, orders.created_at \(.persist.lastCreatedMs // "?") ms), \(.persist.lagAfterLastReservationMs // "?") ms after the last 202 seen by a client",
			"PostgreSQL, from the rows: the last order row written \(.persist.lastInsertedMs // "?") ms after opening (orders.inserted_at), \(.persist.insertedAfterLastCreatedMs // "?") ms after the last reservation (orders.created_at)",
			"redis: \(.redis // "n/a" | tostring)",
			(.steps | to_entries[] | "step \(.key): n=\(.value.count) p50 \(.value.latency.p50Ms) p99 \(.value.latency.p99Ms) max \(.value.latency.maxMs) ms \(.value.outcomes | tostring)"),
			(.invariants[] | "invariant \(.name): \(if .ok then "OK" elif .skipped then "skipped" else "BROKEN" end) \(.detail // "")"),
			(.errors // [] | .[:10][] | "error: \(.)"), (.notes // [] | .[] | "note: \(.)")' "$OUT/$s.json" | tee -a "$OUT/$s.txt"
	fi
	return $rc
}

status=0
for s in "${SCENARIOS[@]}"; do
	start_stack "$s"
	run_scenario "$s" || status=1
	cleanup
	sleep 1
done
exit $status
