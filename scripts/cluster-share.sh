#!/usr/bin/env bash
# The share of stock commands (the reserve, borrow and release scripts,
# whose first key is a shard's fs:{...}:stock) taken by the busiest master
# of a local three-master Redis Cluster, during a drop of one hot item,
# with the item's stock in one shard and in STOCK_SHARDS shards. Each
# master's commands are read with MONITOR. Prints one line per run and
# writes out/cluster-share/summary.txt.
#
#   scripts/cluster-share.sh            # S = 1, then S = 3
#   SHOPPERS=20000 QUANTITY=2000 STOCK_SHARDS=3 scripts/cluster-share.sh
set -u
cd "$(dirname "$0")/.."
GO=${GO:-go}
OUT=${OUT:-out/cluster-share}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
SHOPPERS=${SHOPPERS:-20000}
QUANTITY=${QUANTITY:-2000}
STOCK_SHARDS=${STOCK_SHARDS:-3}
PORT_BASE=${PORT_BASE:-22000}
BIN=./bin/flashsale
SECRET=cluster-share-secret-0123456789abcdef
rm -rf "$OUT" && mkdir -p "$OUT"
$GO build -o "$BIN" ./cmd/flashsale || exit 1
$GO build -o ./bin/flashsale-load ./cmd/flashsale-load || exit 1

pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
}
trap cleanup EXIT

ports=($((PORT_BASE + 1)) $((PORT_BASE + 2)) $((PORT_BASE + 3)))
seeds=""
for p in "${ports[@]}"; do
	mkdir -p "$OUT/redis-$p"
	redis-server --port "$p" --bind 127.0.0.1 --dir "$OUT/redis-$p" --cluster-enabled yes \
		--cluster-config-file "$OUT/redis-$p/nodes.conf" --save '' --appendonly no \
		--maxclients 20000 >"$OUT/redis-$p/log" 2>&1 &
	pids+=($!)
	seeds+="${seeds:+,}127.0.0.1:$p"
done
for p in "${ports[@]}"; do
	until redis-cli -p "$p" ping >/dev/null 2>&1; do sleep 0.1; done
done
redis-cli --cluster create ${seeds//,/ } --cluster-replicas 0 --cluster-yes >"$OUT/create.log" 2>&1 || { cat "$OUT/create.log"; exit 1; }
until redis-cli -p "${ports[0]}" cluster info | grep -q cluster_state:ok; do sleep 0.2; done

HTTP=127.0.0.1:$((PORT_BASE + 80))
ADMIN=127.0.0.1:$((PORT_BASE + 90))
FLASHSALE_REDIS_CLUSTER=$seeds FLASHSALE_JWT_SECRET=$SECRET FLASHSALE_LOG_FORMAT=text FLASHSALE_WS_MAX_CONNS_PER_ADDR=100000 FLASHSALE_MAX_PENDING_CONNS_PER_ADDR=1000000 \
	$BIN dev --data-dir "$OUT/data" --http-addr "$HTTP" --admin-addr "$ADMIN" >"$OUT/dev.log" 2>&1 &
pids+=($!)
until curl -fsS "http://$ADMIN/readyz" >/dev/null 2>&1; do sleep 0.5; done
DB_URL=$(sed -n 's/.*msg="started PostgreSQL" url="\([^"]*\)".*/\1/p' "$OUT/dev.log" | head -n 1)
# Permissive bot defense: the simulated shoppers share a few loopback
# addresses, so per-address limits would measure the tool.
OP_TOKEN=$(FLASHSALE_JWT_SECRET=$SECRET $BIN token --user 1 --role operator)
curl -fsS -X PUT -H "Authorization: Bearer $OP_TOKEN" -H 'Content-Type: application/json' \
	--data '{"rateLimit": {"perIp": {"rps": 1000000, "burst": 1000000}, "perUser": {"rps": 1000000, "burst": 1000000}}, "pow": {"difficulty": 0}, "blocklist": {"cidrs": [], "users": []}}' \
	"http://$HTTP/api/admin/settings" >"$OUT/settings.json" || exit 1
sleep 3 # applied on every gateway within 2 s

run() { # run S
	local s=$1 mons=() p
	for p in "${ports[@]}"; do
		redis-cli -p "$p" monitor >"$OUT/monitor-$s-$p.txt" 2>/dev/null &
		mons+=($!)
	done
	./bin/flashsale-load --scenario drop --shoppers "$SHOPPERS" --quantity "$QUANTITY" --items 1 \
		--stock-shards "$s" --starts-in 10s --processes 2 --source-addrs 16 --linger 2s \
		--url "http://$HTTP" --admin-url "http://$ADMIN" --secret "$SECRET" \
		--database-url "$DB_URL" --json "$OUT/load-$s.json" --html "" >"$OUT/load-$s.txt" 2>&1
	local rc=$?
	sleep 1
	kill "${mons[@]}" 2>/dev/null
	wait "${mons[@]}" 2>/dev/null
	local counts=() total=0 top=0 n
	for p in "${ports[@]}"; do
		n=$(grep -cE '"evalsha?" "[^"]*" "[0-9]+" "fs:\{[^}]*\}:stock"' "$OUT/monitor-$s-$p.txt")
		counts+=("$p:$n")
		total=$((total + n))
		[ "$n" -gt "$top" ] && top=$n
	done
	local share=0
	[ "$total" -gt 0 ] && share=$(awk -v t="$top" -v n="$total" 'BEGIN { printf "%.1f", 100 * t / n }')
	local joined errors
	joined=$(jq .counters.joined "$OUT/load-$s.json" 2>/dev/null)
	errors=$(jq .counters.errors "$OUT/load-$s.json" 2>/dev/null)
	echo "S=$s stock commands per master: ${counts[*]}  busiest: $share%  joined $joined of $SHOPPERS, errors $errors, loadtest rc=$rc" | tee -a "$OUT/summary.txt"
	[ "$rc" = 0 ] && [ "$errors" = 0 ] || failed=1
}
failed=0
run 1
run "$STOCK_SHARDS"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/summary.txt"
exit $failed
