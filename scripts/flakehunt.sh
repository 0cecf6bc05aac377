#!/usr/bin/env bash
# Flake hunt: run the end-to-end and browser test packages many times, first
# alone, then next to a CPU hog (two busy loops, one per core of a 2-core
# machine), and report every test that failed even once. A test that fails
# once in ten runs is a bug in the test or the code, never noise.
#
#   scripts/flakehunt.sh                 # COUNT=3 runs of each package, alone and hogged
#   COUNT=10 scripts/flakehunt.sh        # more runs
#   MODES=hog scripts/flakehunt.sh       # only next to the hog (or MODES=alone)
#   PKGS="./waitroom/" scripts/flakehunt.sh
#   RUN='TestAccessibility' PKGS=./browsertest/ scripts/flakehunt.sh
#
# Each package's test binary is built once (race detector on, as in make
# test) and run COUNT times per mode with -test.count=1, so one failing run
# does not hide the next. Logs: out/flakehunt/<mode>-<pkg>-<n>.log; the
# summary is out/flakehunt/summary.txt. Exit status 1 when any run failed.
set -uo pipefail
cd "$(dirname "$0")/.."

COUNT=${COUNT:-3}
MODES=${MODES:-"alone hog"}
PKGS=${PKGS:-"./internal/wiring/ ./browsertest/ ./waitroom/ ./gateway/"}
RUN=${RUN:-}
TIMEOUT=${TIMEOUT:-20m}
OUT=out/flakehunt
mkdir -p "$OUT"
rm -f "$OUT"/*.log "$OUT"/summary.txt

hogs=()
stop_hog() {
	for p in "${hogs[@]}"; do kill "$p" 2>/dev/null; done
	hogs=()
}
trap stop_hog EXIT
start_hog() {
	for _ in 1 2; do
		bash -c 'while :; do :; done' &
		hogs+=($!)
	done
}

# The browser tests need axe-core (make test installs it the same way).
if [[ " $PKGS " == *browsertest* ]] && command -v npm >/dev/null; then
	(cd static && npm ci --no-audit --no-fund --loglevel=error) || exit 1
fi

declare -A bin
for p in $PKGS; do
	name=$(echo "$p" | sed 's#^\./##; s#/$##; s#/#-#g')
	bin[$p]="$OUT/$name.test"
	go test -race -c -o "${bin[$p]}" "$p" || exit 1
done

runs=0
failed=0
start=$(date +%s)
for mode in $MODES; do
	[ "$mode" = hog ] && start_hog
	for i in $(seq 1 "$COUNT"); do
		for p in $PKGS; do
			name=$(basename "${bin[$p]}" .test)
			log="$OUT/$mode-$name-$i.log"
			args=(-test.count=1 -test.timeout "$TIMEOUT")
			[ -n "$RUN" ] && args+=(-test.run "$RUN")
			# A test binary runs in its package's directory, as go test does.
			(cd "$p" && "$OLDPWD/${bin[$p]}" "${args[@]}") >"$log" 2>&1
			rc=$?
			runs=$((runs + 1))
			if [ $rc -ne 0 ]; then
				failed=$((failed + 1))
				echo "FAIL $mode $name run $i (load $(cut -d' ' -f1 /proc/loadavg)): $log"
				grep -E '^\s*--- FAIL' "$log" | sed 's/^/    /' | head -20
			else
				echo "ok   $mode $name run $i (load $(cut -d' ' -f1 /proc/loadavg))"
			fi
		done
	done
	[ "$mode" = hog ] && stop_hog
done

{
	echo "flakehunt $(date -u +%FT%TZ) on $(git rev-parse --short HEAD 2>/dev/null): $runs package runs ($COUNT each of: $PKGS; modes: $MODES), $failed failed, $(($(date +%s) - start)) s"
	grep -h -E '^\s*--- FAIL' "$OUT"/*.log 2>/dev/null | sed 's/ (.*//; s/^ *//' | sort | uniq -c | sort -rn
} | tee "$OUT/summary.txt"
[ "$failed" -eq 0 ]
