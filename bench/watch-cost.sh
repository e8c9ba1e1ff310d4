#!/usr/bin/env bash
# The cost of `pgbelow watch` on a pgbench-loaded cluster: its CPU (share of
# one CPU, from /proc/PID/stat utime+stime) and RSS, sampled every 30 s.
# Usage (root): [WATCH_ARGS="--collectors …"] [RATE=TPS] [SCRAPE_S=5] bench/watch-cost.sh [MINUTES] [PGBELOW_BINARY]
# RATE throttles pgbench (-R) so a long run leaves the machine usable;
# /metrics is scraped every SCRAPE_S seconds (default 5), as a Prometheus would.
# Starts its own cluster of the system's PostgreSQL in a temp dir (as the
# postgres account) and removes it at the end.
# The server listens on localhost's TCP port as a user's does
# (LISTEN_ADDRESSES= for the Unix socket only, as before 2026-12-03).
set -euo pipefail
minutes=${1:-5}
bin=$(realpath "${2:-target/release/pgbelow}")
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
dir=$(mktemp -d /tmp/pgbelow-watchcost-XXXXXX)
chown postgres: "$dir"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
as_pg() { runuser -u postgres -- "$@"; }
cleanup() {
  [ -n "${wpid:-}" ] && kill -TERM "$wpid" 2>/dev/null && wait "$wpid" 2>/dev/null || true
  [ -n "${lpid:-}" ] && kill "$lpid" 2>/dev/null || true
  [ -n "${spid:-}" ] && kill "$spid" 2>/dev/null || true
  as_pg "$pgbin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
as_pg "$pgbin/initdb" -A trust -U postgres -D "$dir/data" >/dev/null
as_pg "$pgbin/pg_ctl" -w -D "$dir/data" -l "$dir/log" -o "-k $dir -p $port -c listen_addresses='${LISTEN_ADDRESSES-localhost}'" start >/dev/null
pgbench -h "$dir" -p "$port" -U postgres -i -q -s 10 postgres >/dev/null 2>&1
secs=$((minutes * 60 + 30))
pgbench -h "$dir" -p "$port" -U postgres -S -M prepared -c 2 ${RATE:+-R "$RATE"} -T "$secs" postgres >"$dir/pgbench.out" 2>&1 &
lpid=$!
"$bin" watch --dsn "host=$dir port=$port user=postgres dbname=postgres" --listen "127.0.0.1:$mport" ${WATCH_ARGS:-} 2>"$dir/watch.log" &
wpid=$!
( while sleep "${SCRAPE_S:-5}"; do curl -s -o /dev/null "http://127.0.0.1:$mport/metrics" || true; done ) &
spid=$!
tick=$(getconf CLK_TCK)
page=$(getconf PAGESIZE)
cpu_of() { awk -v t="$tick" '{ s=$0; sub(/.*\) /, "", s); split(s, f, " "); printf "%.2f", (f[12]+f[13])/t }' "/proc/$wpid/stat"; }
rss_of() { awk -v p="$page" '{ printf "%.1f", $2*p/1048576 }' "/proc/$wpid/statm"; }
echo "minute cpu_s rss_mib cpu_share_since_start"
sleep 5
c0=$(cpu_of); t0=$(date +%s.%N)
for i in $(seq 1 $((minutes * 2))); do
  sleep 30
  c=$(cpu_of); t=$(date +%s.%N)
  awk -v i="$i" -v c="$c" -v c0="$c0" -v t="$t" -v t0="$t0" -v r="$(rss_of)" \
    'BEGIN { printf "%.1f %s %s %.2f%%\n", i/2, c, r, (c-c0)/(t-t0)*100 }'
done
echo "scrape:"
curl -s "http://127.0.0.1:$mport/metrics" | grep -E '^(process_|pgbelow_(window|statements_total|finding_active.*} 1))' || true
wait "$lpid" || true; lpid=""
grep -E "^tps" "$dir/pgbench.out" || true
