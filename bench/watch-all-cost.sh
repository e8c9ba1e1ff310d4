#!/usr/bin/env bash
# The cost of `pgbelow watch --all` on N idle clusters: its CPU (share of
# one CPU, from /proc/PID/stat utime+stime) and RSS, sampled every 30 s,
# and how many servers it watched (other postmasters on the host count too:
# run it on a quiet machine).
# Usage (root): [WATCH_ARGS="--window 60"] [SCRAPE_S=5] bench/watch-all-cost.sh [N] [MINUTES] [PGBELOW_BINARY]
# Starts N clusters of the system's PostgreSQL in temp dirs (as the postgres
# account; the first with cluster_name set) and removes them at the end.
# The server listens on localhost's TCP port as a user's does
# (LISTEN_ADDRESSES= for the Unix socket only, as before 2026-12-03).
set -euo pipefail
n=${1:-1}
minutes=${2:-3}
bin=$(realpath "${3:-target/release/pgbelow}")
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
as_pg() { runuser -u postgres -- "$@"; }
dirs=()
cleanup() {
  [ -n "${wpid:-}" ] && kill -TERM "$wpid" 2>/dev/null && wait "$wpid" 2>/dev/null || true
  [ -n "${spid:-}" ] && kill "$spid" 2>/dev/null || true
  for d in "${dirs[@]}"; do
    as_pg "$pgbin/pg_ctl" -D "$d/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$d"
  done
}
trap cleanup EXIT
for i in $(seq 1 "$n"); do
  d=$(mktemp -d /tmp/pgbelow-watchallcost-XXXXXX)
  dirs+=("$d")
  chown postgres: "$d"
  name=""
  [ "$i" = 1 ] && name="-c cluster_name=cost$i"
  as_pg "$pgbin/initdb" -A trust -U postgres --no-sync -D "$d/data" >/dev/null
  as_pg "$pgbin/pg_ctl" -w -D "$d/data" -l "$d/log" -o "-k $d -p $(free_port) -c listen_addresses='${LISTEN_ADDRESSES-localhost}' $name" start >/dev/null
done
mport=$(free_port)
log=$(mktemp /tmp/pgbelow-watchallcost-XXXXXX.log)
"$bin" watch --all --listen "127.0.0.1:$mport" ${WATCH_ARGS:-} 2>"$log" &
wpid=$!
( while sleep "${SCRAPE_S:-5}"; do curl -s -o /dev/null "http://127.0.0.1:$mport/metrics" || true; done ) &
spid=$!
tick=$(getconf CLK_TCK)
page=$(getconf PAGESIZE)
cpu_of() { awk -v t="$tick" '{ s=$0; sub(/.*\) /, "", s); split(s, f, " "); printf "%.2f", (f[12]+f[13])/t }' "/proc/$wpid/stat"; }
rss_of() { awk -v p="$page" '{ printf "%.1f", $2*p/1048576 }' "/proc/$wpid/statm"; }
watched() { curl -s "http://127.0.0.1:$mport/metrics" | awk '/^pgbelow_servers_watched /{print $2}'; }
echo "clusters started: $n"
echo "minute cpu_s rss_mib servers_watched cpu_share_since_start"
sleep 5
c0=$(cpu_of); t0=$(date +%s.%N)
for i in $(seq 1 $((minutes * 2))); do
  sleep 30
  c=$(cpu_of); t=$(date +%s.%N)
  awk -v i="$i" -v c="$c" -v c0="$c0" -v t="$t" -v t0="$t0" -v r="$(rss_of)" -v w="$(watched)" \
    'BEGIN { printf "%.1f %s %s %s %.2f%%\n", i/2, c, r, w, (c-c0)/(t-t0)*100 }'
done
echo "servers watched at some point: $(grep -c ': watching the postmaster pid' "$log")"
rm -f "$log"
