#!/usr/bin/env bash
# What pgbelow costs as the server's connections grow: `watch` (default
# window and collectors) for MINUTES, then a 60 s `record`, beside 10 active
# connections (pgbench select-only at RATE tps) with 1,000 more connections
# held open (a second pgbench whose clients each select once every 30 s).
# Prints, for 10 and for 1,010 connections: watch's CPU as a share of one
# CPU and its RSS, and record's own CPU (its manifest's pgbelow_cpu_s);
# and the server's side of each: its backend's CPU (watch's
# pgbelow_observer_backend_cpu_seconds_total over its finished windows,
# record's manifest observer_backend_cpu_s), as a share of one CPU.
# Usage (root): bench/watch-connections.sh [MINUTES] [PGBELOW_BINARY]
set -euo pipefail
minutes=${1:-3}
bin=$(realpath "${2:-target/release/pgbelow}")
MAX_CONNECTIONS=1100
source "$(dirname "$0")/conns-server.sh"
tick=$(getconf CLK_TCK)
secs=$((minutes * 60))
echo "connections watch_cpu_pct watch_rss_mib watch_backend_pct record_cpu_s record_cpu_pct record_backend_pct"
for idle in 0 1000; do
  pids=()
  start_load $((secs + 120)) "$idle"
  sleep 5
  mport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$bin" watch --dsn "$dsn" --listen "127.0.0.1:$mport" --since 0 2>"$dir/watch.log" &
  wpid=$!
  sleep "$secs"
  cpu=$(awk -v t="$tick" '{ s=$0; sub(/.*\) /, "", s); split(s, f, " "); printf "%.3f", (f[12]+f[13])/t }' "/proc/$wpid/stat")
  rss=$(awk -v p="$(getconf PAGESIZE)" '{ printf "%.1f", $2*p/1048576 }' "/proc/$wpid/statm")
  metrics=$(curl -s "http://127.0.0.1:$mport/metrics")
  wback=$(awk '/^pgbelow_observer_backend_cpu_seconds_total /{c=$2} /^pgbelow_window_seconds_total /{w=$2} END{if (w > 0 && c != "") printf "%.2f", 100*c/w; else print "-"}' <<<"$metrics")
  kill -TERM "$wpid"; wait "$wpid" 2>/dev/null || true
  n=$(psql -h "$dir" -p "$port" -U postgres -Atc "select count(*) from pg_stat_activity where backend_type = 'client backend'" postgres)
  "$bin" record --dsn "$dsn" --duration 60 --since 0 --format json --out "$dir/rec-$idle" >/dev/null 2>"$dir/record.log"
  rcpu=$(python3 -c "import json; print(json.load(open('$dir/rec-$idle/manifest.json'))['pgbelow_cpu_s'])")
  rback=$(python3 -c "import json; m=json.load(open('$dir/rec-$idle/manifest.json')); c=m.get('observer_backend_cpu_s'); print('-' if c is None else round(100*c/m['duration_s'], 2))")
  echo "$n $(python3 -c "print(round(100*$cpu/$secs, 2))") $rss $wback $rcpu $(python3 -c "print(round(100*$rcpu/60, 2))") $rback"
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  sleep 3
done
