#!/usr/bin/env bash
# `watch` beside 1,000 connections for MINUTES: its RSS and CPU (share of
# one CPU) each minute, to show whether memory levels off once the history
# (--history, 120 s by default) is full, as it does beside 10 connections
# (bench/watch-cost.sh). 10 active connections at RATE tps and IDLE more
# (default 1000) that wake every 15-45 s at random (SPREAD=1, as an
# application's pool does; SPREAD=0 wakes them together every 30 s).
# Usage (root): [IDLE=N] [SPREAD=0|1] bench/watch-connections-memory.sh [MINUTES] [PGBELOW_BINARY]
set -euo pipefail
minutes=${1:-15}
bin=$(realpath "${2:-target/release/pgbelow}")
idle=${IDLE:-1000}
export SPREAD=${SPREAD:-1}
MAX_CONNECTIONS=$((idle + 100))
source "$(dirname "$0")/conns-server.sh"
tick=$(getconf CLK_TCK)
start_load $((minutes * 60 + 60)) "$idle"
sleep 5
"$bin" watch --dsn "$dsn" --listen 127.0.0.1:0 --since 0 2>"$dir/watch.log" &
w=$!; pids+=($w)
cpu() { awk -v t="$tick" '{ s=$0; sub(/.*\) /, "", s); split(s, f, " "); printf "%.3f", (f[12]+f[13])/t }' "/proc/$w/stat"; }
rss() { awk -v p="$(getconf PAGESIZE)" '{ printf "%.1f", $2*p/1048576 }' "/proc/$w/statm"; }
echo "minute rss_mib cpu_pct_this_minute triggers_so_far"
last=$(cpu)
for m in $(seq 1 "$minutes"); do
  sleep 60
  now=$(cpu)
  echo "$m $(rss) $(python3 -c "print(round(100*($now-$last)/60, 2))") $(grep -c trigger "$dir/watch.log" || true)"
  last=$now
done
