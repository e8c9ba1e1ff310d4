#!/usr/bin/env bash
# Two builds of pgbelow side by side: both `watch` (default window and
# collectors, --budget 0.01 so neither escalates) attached at once to one
# server with 10 active connections (pgbench select-only at RATE tps) and
# IDLE more that each select once every 30 s. After WARM seconds, each
# watch's CPU over the next SPAN seconds, as a share of one CPU, and its
# RSS. Both see the same load at the same time, so their ratio holds on a
# noisy machine where two runs an hour apart do not.
# Usage (root): bench/watch-ab.sh OLD_BINARY NEW_BINARY [WARM] [SPAN]
set -euo pipefail
old=$(realpath "$1"); new=$(realpath "$2")
warm=${3:-90}; span=${4:-240}; idle=${IDLE:-1000}
MAX_CONNECTIONS=$((idle + 100))
source "$(dirname "$0")/conns-server.sh"
secs=$((warm + span + 60))
start_load "$secs" "$idle"
sleep 5
"$old" watch --dsn "$dsn" --listen 127.0.0.1:0 --since 0 --budget 0.01 2>"$dir/old.log" &
wold=$!; pids+=($wold)
"$new" watch --dsn "$dsn" --listen 127.0.0.1:0 --since 0 --budget 0.01 2>"$dir/new.log" &
wnew=$!; pids+=($wnew)
sleep "$warm"
ticks() { awk '{ s=$0; sub(/.*\) /, "", s); split(s, f, " "); print f[12]+f[13] }' "/proc/$1/stat"; }
rss() { awk -v p="$(getconf PAGESIZE)" '{ printf "%.1f", $2*p/1048576 }' "/proc/$1/statm"; }
o0=$(ticks $wold); n0=$(ticks $wnew); ro=$(rss $wold); rn=$(rss $wnew)
sleep "$span"
o1=$(ticks $wold); n1=$(ticks $wnew)
tick=$(getconf CLK_TCK)
# A trigger that trips (each watch's bursts at window ends can lift the
# backends' run-queue wait on two CPUs) judges an incident: its CPU and
# memory are in the figures, so say how many each had.
trips() { grep -c "trigger" "$1" || true; }
echo "build cpu_pct rss_mib_at_warm rss_mib_at_end triggers"
echo "old $(python3 -c "print(round(100*($o1-$o0)/$tick/$span, 2))") $ro $(rss $wold) $(trips "$dir/old.log")"
echo "new $(python3 -c "print(round(100*($n1-$n0)/$tick/$span, 2))") $rn $(rss $wnew) $(trips "$dir/new.log")"
