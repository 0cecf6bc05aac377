#!/usr/bin/env bash
# The fault suite: a drop on a stack of separate processes, with one part
# killed (and, where it has one, restarted) in the middle of it.
#
#   scripts/faults.sh [FAULT ...]       (make faults; default: every fault)
#
# Faults:
#   none             no fault: the baseline the others are read against
#   gateway          kill -9 of one of the two gateways (not restarted)
#   writer           kill -9 of the writer, restarted 5 s later
#   expiry           kill -9 of one of two expiry workers (20 s payment
#                    window, so orders expire during the drop)
#   broker           kill -9 of the Kafka broker, restarted 5 s later on its
#                    data directory
#   redis            kill -9 of redis-server, restarted empty
#   redis-failover   the replica (replicaof) is promoted, the master keeps
#                    taking writes the replica misses for REPLICA_LAG, then
#                    is killed and clients are moved to the replica (a TCP
#                    forwarder stands in for the address flip of a managed
#                    Redis)
#   postgres         PostgreSQL stopped (-m immediate) for PG_DOWN
#   redis-freeze     redis-server stopped (SIGSTOP) for 8 s, then SIGCONT
#   leader-freeze    the waiting room's leader gateway (the one whose
#                    flashsale_waitroom_leading_sales is 1) stopped
#                    (SIGSTOP) for 10 s, then SIGCONT
#   writer-freeze    two writers run; one is stopped (SIGSTOP) for 20 s,
#                    then SIGCONT
#   gateways         kill -9 of every gateway, restarted 3 s later
#   broker-down      kill -9 of the Kafka broker, restarted 30 s later on
#                    its data directory
#   postgres-twice   PostgreSQL restarted at once (-m immediate) twice,
#                    15 s apart
#   redis-twice      kill -9 of redis-server, restarted empty, twice, 10 s
#                    apart
#   draw-kill        kill -9 of the leader gateway at the draw
#                    (FLASHSALE_DRAW_LEAD before the opening), not restarted
#   clock-skew       the last gateway runs with FLASHSALE_CLOCK_SKEW=2s (its
#                    own clock 2 s fast); nothing is injected
#
# Each fault gets a fresh stack under out/faults/<fault>/: redis-server,
# PostgreSQL, `flashsale broker`, `flashsale writer`, two `flashsale expiry`,
# GATEWAYS `flashsale gateway` processes; `flashsale-load --scenario drop`
# runs over every gateway, and the fault is injected FAULT_AT after the
# sale's opening (draw-kill: at the draw). out/faults/summary.json gets one
# object per fault; the suite exits non-zero when any fault broke an
# invariant or was invalid.
#
# Every fault must land mid-sale: a run that reserved no unit after the
# fault instant (server time, orders.created_at) tested nothing, so its
# summary says valid: false and the suite fails. The sale is shaped for
# that. It is allocated in queue order (ALLOCATION), the default shoppers
# meet: every unit is held for a shopper at the draw, so the units sell as
# fast as the holders click, and the leader's allocation passes and the
# holds' rebuild after a Redis loss are on the path of the sale. The holders
# click at human speed (REACTION, the median of a log-normal time from the
# token to the click) but for a few scripts that click at the opening
# (FAST_SHARE), so units sell from the opening until about 3 × REACTION
# after it, and a fault at FAULT_AT lands before most of them.
#
# The shoppers come from SOURCE_ADDRS addresses, few enough per address
# that one gateway can hold them all: a gateway refuses an address's
# connections past FLASHSALE_WS_MAX_CONNS_PER_ADDR (200), and when one of
# two gateways dies its shoppers all move to the other. With 40 addresses
# (250 shoppers each) 2,000 of the movers met 429 until the end, and the
# holders among them lost their claim window (draw-kill).
#
# Knobs (defaults in brackets): SHOPPERS [10000] QUANTITY [2000] ITEMS [4]
#   RATE [1000] GATEWAYS [2] PROCESSES [1] SOURCE_ADDRS [100] STARTS_IN [20s]
#   FAULT_AT [1] (seconds after opening) DURATION [240s] QUIET_TIMEOUT [90s]
#   ALLOCATION [queue] REACTION [4s] FAST_SHARE [0.1] CLAIM_WINDOW [45s]
#   SOLD_OUT_QUIET [the load tool's 10s; 30s in the expiry fault]
#   FLASHSALE_RECONCILE_AFTER [15s] FLASHSALE_DRAW_LEAD [3s] PG_DOWN [20]
#   REPLICA_LAG [0.5] PORT_BASE [21000] BUILD [1]
#   LOADTEST_ARGS [extra loadtest flags]
set -euo pipefail
cd "$(dirname "$0")/.."

ALL=(none gateway writer expiry broker redis redis-failover postgres
	redis-freeze leader-freeze writer-freeze gateways broker-down postgres-twice
	redis-twice draw-kill clock-skew)
FAULTS=("$@")
[ ${#FAULTS[@]} -gt 0 ] || FAULTS=("${ALL[@]}")
BIN=./bin/flashsale
OUT=out/faults
GATEWAYS=${GATEWAYS:-2}
FAULT_AT=${FAULT_AT:-1}
PG_DOWN=${PG_DOWN:-20}
REPLICA_LAG=${REPLICA_LAG:-0.5}
B=${PORT_BASE:-21000}
REDIS_PORT=$((B + 379)) REPLICA_PORT=$((B + 380)) REDIS_VIP=$((B + 381))
PG_PORT=$((B + 432)) KAFKA_PORT=$((B + 92))
WRITER_ADMIN=$((B + 190)) EXPIRY_ADMIN=$((B + 191)) WRITER2_ADMIN=$((B + 193))
mkdir -p "$OUT"

for f in "${FAULTS[@]}"; do
	case " ${ALL[*]} " in *" $f "*) ;; *) echo "unknown fault $f (one of: ${ALL[*]})" >&2; exit 2 ;; esac
done
need=()
for c in redis-server jq socat curl; do command -v $c >/dev/null || need+=("$c"); done
if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
	else
		echo "missing: ${need[*]} (apt-get install ${need[*]})" >&2
		exit 2
	fi
fi
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -x "$PGBIN/pg_ctl" ] || { echo "no PostgreSQL server binaries (apt-get install postgresql)" >&2; exit 2; }
if [ "${BUILD:-1}" = 1 ]; then
	make build >/dev/null
fi
ulimit -n 20000 || ulimit -n "$(ulimit -Hn)"

declare -A PID   # role → pid of the running process
declare -A CMD   # role → its command line, to restart it
pg() { # pg_ctl or initdb, as postgres when root
	if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$PGBIN/$1" "${@:2}"; else "$PGBIN/$1" "${@:2}"; fi
}

stop_all() {
	local r
	# A frozen process (a freeze fault cut short) must run to stop.
	for r in "${!PID[@]}"; do kill -CONT "${PID[$r]}" 2>/dev/null || true; done
	for r in "${!PID[@]}"; do kill -TERM "${PID[$r]}" 2>/dev/null || true; done
	for r in "${!PID[@]}"; do
		for _ in $(seq 1 200); do kill -0 "${PID[$r]}" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "${PID[$r]}" 2>/dev/null || true
	done
	PID=()
	if [ -n "${PGDATA_DIR:-}" ] && [ -f "$PGDATA_DIR/postmaster.pid" ]; then
		pg pg_ctl -D "$PGDATA_DIR" -m fast -w stop >/dev/null 2>&1 || true
	fi
}
trap stop_all EXIT INT TERM

# start ROLE LOGFILE CMD...: starts CMD in the background as ROLE.
start() {
	local role=$1 log=$2
	shift 2
	CMD[$role]=$(printf '%q ' "$@")
	"$@" >>"$log" 2>&1 &
	PID[$role]=$!
}
restart() { # ROLE LOGFILE
	eval "start $1 $2 ${CMD[$1]}"
}
killnine() { kill -KILL "${PID[$1]}" 2>/dev/null || true; wait "${PID[$1]}" 2>/dev/null || true; unset "PID[$1]"; }
freeze() { # ROLE SECONDS: SIGSTOP, then SIGCONT
	kill -STOP "${PID[$1]}"
	sleep "$2"
	kill -CONT "${PID[$1]}"
}

wait_url() { # URL SECONDS
	local i
	for i in $(seq 1 $(($2 * 4))); do
		curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
		sleep 0.25
	done
	echo "timeout waiting for $1" >&2
	return 1
}
wait_port() { # PORT SECONDS
	local i
	for i in $(seq 1 $(($2 * 10))); do
		(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
		sleep 0.1
	done
	echo "timeout waiting for port $1" >&2
	return 1
}
now_ms() { date +%s%3N; }

# duration_ms DURATION: a Go duration of whole ms or s ("3s", "500ms",
# "0") in ms.
duration_ms() {
	case $1 in
	0) echo 0 ;;
	*ms) echo "${1%ms}" ;;
	*s) echo $((${1%s} * 1000)) ;;
	*) echo "duration_ms: want a duration like 3s or 500ms, not $1" >&2; return 1 ;;
	esac
}
DRAW_LEAD_MS=$(duration_ms "${FLASHSALE_DRAW_LEAD:-3s}")

# leader_gateway: the role of the gateway that leads the sale's waiting
# room, from each gateway's flashsale_waitroom_leading_sales.
leader_gateway() {
	local i g v
	for i in $(seq 1 40); do
		for g in $(seq 1 "$GATEWAYS"); do
			[ -n "${PID[gateway$g]:-}" ] || continue
			v=$(curl -fsS -m 1 "http://127.0.0.1:$((B + 180 + g))/metrics" 2>/dev/null |
				awk '$1 == "flashsale_waitroom_leading_sales" { print $2 }')
			if [ -n "$v" ] && [ "${v%%.*}" -gt 0 ]; then
				echo "gateway$g"
				return 0
			fi
		done
		sleep 0.05
	done
	echo "no gateway leads the sale" >&2
	return 1
}

# pg_restart: PostgreSQL stopped at once (-m immediate) and started again.
pg_restart() {
	pg pg_ctl -D "$PGDATA_DIR" -m immediate -w stop >/dev/null 2>&1 || true
	pg pg_ctl -D "$PGDATA_DIR" -o "$PG_OPTS" -l "$PGDATA_DIR/server.log" -w -t 60 start >/dev/null
}

start_stack() { # fault
	local f=$1 dir="$OUT/$1" g
	rm -rf "$dir"
	mkdir -p "$dir/redis" "$dir/replica" "$dir/kafka"
	dir=$(realpath "$dir") # redis-server changes to its --dir
	export FLASHSALE_JWT_SECRET="faults-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')"
	export FLASHSALE_LOG_LEVEL=${FLASHSALE_LOG_LEVEL:-warn}
	# The simulated shoppers share a few loopback addresses and warm
	# thousands of connections at once: no cap on connections before
	# their first request.
	export FLASHSALE_MAX_PENDING_CONNS_PER_ADDR=1000000
	export FLASHSALE_RECONCILE_AFTER=${FLASHSALE_RECONCILE_AFTER:-15s}
	if [ "$f" = expiry ]; then
		export FLASHSALE_PAYMENT_WINDOW=20s FLASHSALE_EXPIRY_INTERVAL=2s
	else
		unset FLASHSALE_PAYMENT_WINDOW FLASHSALE_EXPIRY_INTERVAL
	fi

	# Redis: clients use REDIS_VIP through a forwarder only in the failover
	# fault, where the address must move to the replica.
	start redis "$dir/redis.out" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$dir/redis" \
		--save '' --appendonly no --daemonize no --maxclients 10000 --logfile "$dir/redis/redis.log"
	wait_port "$REDIS_PORT" 10
	local redis_port=$REDIS_PORT
	if [ "$f" = redis-failover ]; then
		start replica "$dir/replica.out" redis-server --port "$REPLICA_PORT" --bind 127.0.0.1 --dir "$dir/replica" \
			--save '' --appendonly no --daemonize no --maxclients 10000 --logfile "$dir/replica/redis.log" \
			--replicaof 127.0.0.1 "$REDIS_PORT"
		wait_port "$REPLICA_PORT" 10
		start vip "$dir/vip.log" socat "TCP-LISTEN:$REDIS_VIP,bind=127.0.0.1,fork,reuseaddr" "TCP:127.0.0.1:$REDIS_PORT"
		wait_port "$REDIS_VIP" 10
		redis_port=$REDIS_VIP
	fi
	export FLASHSALE_REDIS_URL="redis://127.0.0.1:$redis_port/0"

	# PostgreSQL
	PGDATA_DIR=$dir/pg
	mkdir -p "$PGDATA_DIR"
	chmod 700 "$PGDATA_DIR"
	[ "$(id -u)" = 0 ] && chown postgres "$PGDATA_DIR"
	pg initdb -D "$PGDATA_DIR" -A trust -U postgres -E UTF8 --no-sync >"$dir/initdb.log" 2>&1
	PG_OPTS="-p $PG_PORT -k $PGDATA_DIR -c listen_addresses=127.0.0.1 -c max_connections=300"
	pg pg_ctl -D "$PGDATA_DIR" -o "$PG_OPTS" -l "$PGDATA_DIR/server.log" -w -t 60 start >/dev/null
	export FLASHSALE_DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres?sslmode=disable"
	$BIN migrate >"$dir/migrate.log" 2>&1

	# Kafka
	start broker "$dir/broker.log" $BIN broker --port "$KAFKA_PORT" --data-dir "$dir/kafka"
	wait_port "$KAFKA_PORT" 20
	export FLASHSALE_KAFKA_BROKERS=127.0.0.1:$KAFKA_PORT

	start writer "$dir/writer.log" $BIN writer --admin-addr "127.0.0.1:$WRITER_ADMIN"
	if [ "$f" = writer-freeze ]; then
		start writer2 "$dir/writer2.log" $BIN writer --admin-addr "127.0.0.1:$WRITER2_ADMIN"
	fi
	start expiry1 "$dir/expiry1.log" $BIN expiry --admin-addr "127.0.0.1:$EXPIRY_ADMIN"
	start expiry2 "$dir/expiry2.log" $BIN expiry --admin-addr "127.0.0.1:$((EXPIRY_ADMIN + 1))"
	URLS=""
	for g in $(seq 1 "$GATEWAYS"); do
		local skew=0
		[ "$f" = clock-skew ] && [ "$g" = "$GATEWAYS" ] && skew=2s
		start "gateway$g" "$dir/gateway$g.log" env FLASHSALE_CLOCK_SKEW=$skew $BIN gateway \
			--http-addr "127.0.0.1:$((B + 80 + g))" --admin-addr "127.0.0.1:$((B + 180 + g))"
		URLS="${URLS:+$URLS,}http://127.0.0.1:$((B + 80 + g))"
	done
	for g in $(seq 1 "$GATEWAYS"); do wait_url "http://127.0.0.1:$((B + 180 + g))/readyz" 60; done
	wait_url "http://127.0.0.1:$WRITER_ADMIN/readyz" 60
	if [ "$f" = writer-freeze ]; then wait_url "http://127.0.0.1:$WRITER2_ADMIN/readyz" 60; fi
	echo "stack for $f: gateways $URLS, $FLASHSALE_REDIS_URL, $FLASHSALE_DATABASE_URL, kafka $FLASHSALE_KAFKA_BROKERS"

	# Permissive bot defense: the simulated shoppers share a few loopback
	# addresses, so per-address limits would measure the tool.
	OP_TOKEN=$($BIN token --user 1 --role operator)
	curl -fsS -X PUT -H "Authorization: Bearer $OP_TOKEN" -H 'Content-Type: application/json' \
		--data '{"rateLimit": {"perIp": {"rps": 1000000, "burst": 1000000}, "perUser": {"rps": 1000000, "burst": 1000000}}, "pow": {"difficulty": 0}, "blocklist": {"cidrs": [], "users": []}}' \
		"http://127.0.0.1:$((B + 81))/api/admin/settings" >"$dir/settings.json"
	sleep 3 # applied on every gateway within 2 s
}

# opening_ms: the opening instant (Unix ms) of the sale the load tool
# created, once it exists.
opening_ms() {
	local i s
	for i in $(seq 1 600); do
		s=$(curl -fsS -H "Authorization: Bearer $OP_TOKEN" "http://127.0.0.1:$((B + 81))/api/admin/sales" 2>/dev/null |
			jq -r '(if type == "array" then . else (.sales // []) end) | map(.startsAt) | last // empty' 2>/dev/null || true)
		if [ -n "$s" ]; then
			date -d "$s" +%s%3N
			return 0
		fi
		sleep 0.5
	done
	return 1
}

# inject FAULT DIR: injects the fault in this shell (so that restarted
# processes are ours to stop) and writes its Unix ms to DIR/fault_ms, and
# the Unix ms at which the part is back (restarted, woken up; the fault
# instant for a part not brought back) to DIR/fault_end_ms.
inject() {
	local f=$1 dir=$2
	echo "$(now_ms)" >"$dir/fault_ms"
	_inject "$f" "$dir"
	echo "$(now_ms)" >"$dir/fault_end_ms"
}
_inject() {
	local f=$1 dir=$2
	case $f in
	none) ;;
	gateway)
		killnine "gateway$GATEWAYS" ;;
	writer)
		killnine writer
		sleep 5; restart writer "$dir/writer.log" ;;
	expiry)
		killnine expiry2 ;;
	broker)
		killnine broker
		sleep 5; restart broker "$dir/broker.log" ;;
	redis)
		killnine redis
		restart redis "$dir/redis.out" ;;
	redis-failover)
		# The replica stops replicating (promoted); the master goes on
		# taking writes it will never see, then dies.
		redis-cli -p "$REPLICA_PORT" replicaof no one >/dev/null
		sleep "$REPLICA_LAG"
		echo "$(now_ms)" >"$dir/fault_ms"
		killnine redis; killnine vip
		start vip "$dir/vip.log" socat "TCP-LISTEN:$REDIS_VIP,bind=127.0.0.1,fork,reuseaddr" "TCP:127.0.0.1:$REPLICA_PORT" ;;
	postgres)
		pg pg_ctl -D "$PGDATA_DIR" -m immediate -w stop >/dev/null 2>&1 || true
		sleep "$PG_DOWN"
		pg pg_ctl -D "$PGDATA_DIR" -o "$PG_OPTS" -l "$PGDATA_DIR/server.log" -w -t 60 start >/dev/null ;;
	redis-freeze)
		freeze redis 8 ;;
	leader-freeze)
		local leader
		leader=$(leader_gateway)
		echo "leader: $leader" >>"$dir/run.txt"
		freeze "$leader" 10 ;;
	writer-freeze)
		freeze writer 20 ;;
	gateways)
		local g
		for g in $(seq 1 "$GATEWAYS"); do killnine "gateway$g"; done
		sleep 3
		for g in $(seq 1 "$GATEWAYS"); do restart "gateway$g" "$dir/gateway$g.log"; done ;;
	broker-down)
		killnine broker
		sleep 30; restart broker "$dir/broker.log" ;;
	postgres-twice)
		pg_restart
		sleep 15; pg_restart ;;
	redis-twice)
		killnine redis
		restart redis "$dir/redis.out"
		sleep 10
		killnine redis
		restart redis "$dir/redis.out" ;;
	draw-kill)
		# run_fault found the leader just before the draw.
		echo "leader: $LEADER" >>"$dir/run.txt"
		killnine "$LEADER" ;;
	clock-skew) ;;
	esac
}

# fault_offset_ms FAULT: when the fault is injected, in ms after the
# opening.
fault_offset_ms() {
	case $1 in
	draw-kill) echo $((-DRAW_LEAD_MS)) ;;
	*) echo $((FAULT_AT * 1000)) ;;
	esac
}

run_fault() { # fault
	local f=$1 dir="$OUT/$1" args=() rc=0 open fault_ms
	args+=(--shoppers "${SHOPPERS:-10000}" --quantity "${QUANTITY:-2000}" --items "${ITEMS:-4}")
	args+=(--rate "${RATE:-1000}" --starts-in "${STARTS_IN:-20s}" --processes "${PROCESSES:-1}")
	# The shoppers stay until DURATION - QUIET_TIMEOUT - 2 s after the
	# start (about 2 minutes after the opening), or until the sale has been
	# sold out with nothing on its way back for 10 s: longer than the
	# slowest return path of the longest fault (the broker down 30 s, then
	# a hold's window).
	args+=(--source-addrs "${SOURCE_ADDRS:-100}" --duration "${DURATION:-240s}" --quiet-timeout "${QUIET_TIMEOUT:-90s}")
	# The sale's shape, so that the fault lands mid-sale (the header).
	args+=(--allocation "${ALLOCATION:-queue}" --reaction "${REACTION:-4s}" --fast-share "${FAST_SHARE:-0.1}")
	# A hold not used within CLAIM_WINDOW goes to the next in line within
	# the run (the default window, 2 minutes, would outlast the shoppers).
	[ "${ALLOCATION:-queue}" = queue ] && args+=(--claim-window "${CLAIM_WINDOW:-45s}")
	# Shoppers told SOLD_OUT stay connected, as the page does (CONTRACT
	# section 4), so a unit that a fault held back and that comes back later
	# must be sold to them: otherwise it is stranded.
	args+=(--keep-waiting)
	# The shoppers leave once the sale has been sold out, with nothing on
	# its way back, for SOLD_OUT_QUIET. An unpaid order is not "on its way
	# back" until its payment window ends, so in the expiry fault (20 s
	# window, 2 s scans) the quiet must outlast a window: then every order
	# pending at its start has been paid or has expired and sold again
	# before the shoppers leave, and none comes back to a room of shoppers
	# who are gone while conservation is judged.
	if [ "$f" = expiry ]; then
		args+=(--sold-out-quiet "${SOLD_OUT_QUIET:-30s}")
	elif [ -n "${SOLD_OUT_QUIET:-}" ]; then
		args+=(--sold-out-quiet "$SOLD_OUT_QUIET")
	fi
	# shellcheck disable=SC2206
	[ -n "${LOADTEST_ARGS:-}" ] && args+=(${LOADTEST_ARGS})
	echo "== fault $f  $(date -u +%FT%TZ)  load average before: $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$dir/run.txt"
	./bin/flashsale-load --scenario drop --url "$URLS" --admin-url "http://127.0.0.1:$((B + 181))" \
		--database-url "$FLASHSALE_DATABASE_URL" --redis-url "$FLASHSALE_REDIS_URL" \
		--json "$dir/report.json" --html "$dir/report.html" "${args[@]}" \
		>>"$dir/run.txt" 2>"$dir/loadtest.log" &
	local lt=$!
	open=$(opening_ms) || { echo "no sale appeared" >&2; kill "$lt"; return 1; }
	local at_ms wait_ms
	at_ms=$(fault_offset_ms "$f")
	if [ "$f" = draw-kill ]; then
		# The leader is the one that will draw: found half a second
		# before, while the pre-queue fills.
		wait_ms=$((open + at_ms - 500 - $(now_ms)))
		[ "$wait_ms" -gt 0 ] && sleep "$(awk -v m="$wait_ms" 'BEGIN { printf "%.3f", m / 1000 }')"
		LEADER=$(leader_gateway) || { kill "$lt"; return 1; }
	fi
	wait_ms=$((open + at_ms - $(now_ms)))
	[ "$wait_ms" -gt 0 ] && sleep "$(awk -v m="$wait_ms" 'BEGIN { printf "%.3f", m / 1000 }')"
	inject "$f" "$dir"
	fault_ms=$(cat "$dir/fault_ms")
	echo "fault $f injected at $fault_ms ($((fault_ms - open)) ms after opening)" | tee -a "$dir/run.txt"
	wait "$lt" || rc=$?
	echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg); loadtest exit $rc" | tee -a "$dir/run.txt"
	summarize "$f" "$dir" "$open" "$fault_ms" "$(cat "$dir/fault_end_ms")" "$rc" >"$dir/summary.json"
	jq -c . "$dir/summary.json"
	# A fault that came after the last reservation tested nothing.
	if [ "$(jq -r .valid "$dir/summary.json")" != true ]; then
		echo "fault $f invalid: no unit was reserved after it" | tee -a "$dir/run.txt"
		[ "$rc" != 0 ] || rc=1
	fi
	return "$rc"
}

# summarize FAULT DIR OPEN_MS FAULT_MS END_MS RC: the fault's summary
# object, from the load tool's report (ledger, invariants, timeline) and
# PostgreSQL. The recovery times count from END_MS, when the part was back:
# while the broker is down no order can be acknowledged, so a recovery read
# from the fault instant would measure the fault's own length.
summarize() {
	local f=$1 dir=$2 open=$3 fault=$4 end=$5 rc=$6 at=$(($4 - $3))
	local rejected_db next_row sale rport
	rejected_db=$(psql_q "SELECT count(*) FROM orders WHERE status = 'REJECTED'" || true)
	# The first order row the writer stored after the part was back
	# (orders.inserted_at).
	next_row=$(psql_q "SELECT round(extract(epoch FROM min(inserted_at)) * 1000)::bigint - $end
		FROM orders WHERE inserted_at >= to_timestamp($end / 1000.0)" || true)
	# Server-side times, which in-flight answers do not blur: reservations
	# (orders.created_at) and admissions (the room's admission records,
	# place|admittedAtMs) made after the fault.
	psql_q "SELECT id::text || ' ' || round(extract(epoch FROM created_at) * 1000)::bigint
		FROM orders WHERE created_at >= to_timestamp($fault / 1000.0)" >"$dir/created-after.txt" || true
	sale=$(jq -r '.saleId' "$dir/report.json")
	rport=$REDIS_PORT
	[ "$f" = redis-failover ] && rport=$REPLICA_PORT
	redis-cli -p "$rport" --raw HVALS "wr:{s$sale}:admitted" 2>/dev/null | awk -F'|' -v t="$fault" '$2 >= t' >"$dir/admitted-after.txt" || true
	jq --arg fault "$f" --argjson at "$at" --argjson rc "$rc" --argjson rejectedDb "${rejected_db:-null}" \
		--argjson nextRow "${next_row:-null}" --argjson faultMs "$fault" --argjson endMs "$end" \
		--rawfile created "$dir/created-after.txt" --rawfile admitted "$dir/admitted-after.txt" \
		--arg load "$(cut -d' ' -f1-3 /proc/loadavg)" '
		($created | split("\n") | map(select(length > 0) | split(" ") | {key: .[0], value: (.[1] | tonumber)}) | from_entries) as $createdAt |
		([.ledger[] | select(.source == "purchase_202") | $createdAt[.orderId] // empty | select(. >= $endMs)] | min) as $res |
		($admitted | split("\n") | map(select(length > 0) | split("|")[1] | tonumber | select(. >= $endMs)) | min) as $adm |
		def secs(x): if x == null then null else ((x - $endMs) / 1000) end;
		(.summary // {}) as $s |
		{
			fault: $fault,
			faultAtMs: $at,
			# how long the part was away (killed and restarted, frozen)
			faultSeconds: (($endMs - $faultMs) / 1000),
			oversold: $s.oversold,
			acknowledged: $s.acknowledged,
			acknowledgedLost: $s.acknowledgedLost,
			acknowledgedRejected: $s.acknowledgedRejected,
			strandedUnits: $s.strandedUnits,
			http5xx: $s.http5xx.total,
			http5xxByRoute: $s.http5xx.byRoute,
			http503RetryAfter: $s.http503RetryAfter.total,
			http503RetryAfterByRoute: $s.http503RetryAfter.byRoute,
			# what shoppers met, not the read-back of the load tool
			networkErrorsByRoute: ($s.networkErrors.byRoute // {} | with_entries(select(.key | startswith("ledger_") | not))),
			reconnects: $s.reconnects, gatewayMoves: $s.gatewayMoves, placesLost: $s.placesLost,
			secondsToNextAdmission: secs($adm),
			secondsToNextReservation: secs($res),
			# the next admission waits for a unit to come free (in queue
			# order every unit is held at the draw), so recovery is read
			# from the next purchase that reserved
			recoverySeconds: secs($res),
			secondsToNextOrderRow: (if $nextRow == null then null else $nextRow / 1000 end),
			# units reserved at or after the fault (orders.created_at):
			# none means the fault came after the sale and tested nothing
			reservedAfterFault: ($createdAt | length),
			valid: (($createdAt | length) > 0),
			reserved: .orders.reserved, sold: .orders.sold, remaining: .orders.remaining, quantity: .orders.quantity,
			lastReservationMs: .lastReservationMs,
			rejectedInDatabase: $rejectedDb,
			invariantsBroken: [.invariants[] | select((.ok | not) and (.skipped | not)) | .name],
			loadtestExit: $rc,
			loadAverageAfter: $load
		}' "$dir/report.json"
}

psql_q() {
	"$PGBIN/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -XAtqc "$1" 2>/dev/null
}

status=0
results=()
for f in "${FAULTS[@]}"; do
	start_stack "$f"
	run_fault "$f" || status=1
	results+=("$OUT/$f/summary.json")
	stop_all
	sleep 1
done
jq -s . "${results[@]}" >"$OUT/summary.json"
echo "summary: $OUT/summary.json"
# The rows of docs/FAULTS.md's table (out/faults/table.md).
jq -r '.[] | "| `\(.fault)` | \(.faultSeconds) | \(.oversold) | \(.acknowledged) | \(.acknowledgedLost) | \(.acknowledgedRejected) | \(.strandedUnits) | \(.secondsToNextAdmission // "–") | \(.secondsToNextReservation // "–") | \(.secondsToNextOrderRow // "–") | \(.http5xx) | \(if (.http503RetryAfterByRoute // {}) == {} then "–" else (.http503RetryAfterByRoute | to_entries | map("\(.key): \(.value)") | join(", ")) end) | \(.reservedAfterFault) | \(if .valid then (if (.invariantsBroken | length) == 0 then "all kept" else (.invariantsBroken | join(", ")) end) else "INVALID" end) |"' \
	"$OUT/summary.json" >"$OUT/table.md"
echo "table rows: $OUT/table.md"
jq -r '.[] | [.fault, "oversold=\(.oversold)", "lost=\(.acknowledgedLost)", "rejected=\(.acknowledgedRejected)",
	"stranded=\(.strandedUnits)", "lasted=\(.faultSeconds)s", "recovery=\(.recoverySeconds)s", "5xx=\(.http5xx)", "broken=\(.invariantsBroken | join(","))",
	"reservedAfterFault=\(.reservedAfterFault)", (if .valid then "valid" else "INVALID" end)] | join("  ")' "$OUT/summary.json"
exit $status
