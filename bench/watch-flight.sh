#!/usr/bin/env bash
# The flight recorder over a long run: `pgbelow watch` (default window,
# history, budget and collectors, --keep) on a cluster under a steady
# pgbench load, with a CPU burst injected at a random minute (8 busy loops
# for BURST_S seconds, each in its own session as another service's would
# be). Prints pgbelow's CPU and RSS every minute, then: its mean CPU share,
# the escalations' share of it, the RSS slope, the bytes kept and held,
# the seconds from the burst's start to pgbelow_finding_active{id=
# "cpu-saturation"} = 1 and from its end back to 0, and whether the kept
# incident holds at least 30 s before the onset.
# Usage (root): bench/watch-flight.sh [MINUTES] [PGBELOW_BINARY] [SEED]
set -euo pipefail
minutes=${1:-60}
bin=$(realpath "${2:-target/release/pgbelow}")
seed=${3:-$RANDOM}
spin=$(dirname "$bin")/pgbelow-spin
burst_s=${BURST_S:-40}
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
dir=$(mktemp -d /tmp/pgbelow-bench-flight-XXXXXX)
chown postgres: "$dir"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
as_pg() { runuser -u postgres -- "$@"; }
hogs=()
cleanup() {
  for h in "${hogs[@]}"; do kill "$h" 2>/dev/null || true; done
  [ -n "${wpid:-}" ] && kill -TERM "$wpid" 2>/dev/null && wait "$wpid" 2>/dev/null || true
  [ -n "${lpid:-}" ] && kill "$lpid" 2>/dev/null || true
  as_pg "$pgbin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
as_pg "$pgbin/initdb" -A trust -U postgres -D "$dir/data" >/dev/null
as_pg "$pgbin/pg_ctl" -w -D "$dir/data" -l "$dir/log" -o "-k $dir -p $port -c listen_addresses=''" start >/dev/null
pgbench -h "$dir" -p "$port" -U postgres -i -q -s 10 postgres >/dev/null 2>&1
secs=$((minutes * 60 + 60))
pgbench -h "$dir" -p "$port" -U postgres -S -M prepared -c 4 -j 2 -R "${RATE:-2000}" -T "$secs" postgres >"$dir/pgbench.out" 2>&1 &
lpid=$!
mkdir "$dir/kept"
"$bin" watch --dsn "host=$dir port=$port user=postgres dbname=postgres" --listen "127.0.0.1:$mport" \
  --keep "$dir/kept" ${WATCH_ARGS:-} 2>"$dir/watch.log" &
wpid=$!
tick=$(getconf CLK_TCK)
page=$(getconf PAGESIZE)
cpu_of() { awk -v t="$tick" '{ s=$0; sub(/.*\) /, "", s); split(s, f, " "); printf "%.2f", (f[12]+f[13])/t }' "/proc/$wpid/stat"; }
rss_of() { awk -v p="$page" '{ printf "%.1f", $2*p/1048576 }' "/proc/$wpid/statm"; }
metric() { curl -s "http://127.0.0.1:$mport/metrics" | awk -v m="$1" 'index($0, m" ") == 1 { print $NF; exit }'; }
active() {
  local w c
  w=$(metric 'pgbelow_finding_active{id="cpu-saturation",severity="warning"}')
  c=$(metric 'pgbelow_finding_active{id="cpu-saturation",severity="critical"}')
  [ "${w:-0}" = 1 ] || [ "${c:-0}" = 1 ]
}
# The burst: at a random second between the 3rd minute and 3 minutes before the end.
RANDOM=$seed
lo=180; hi=$((minutes * 60 - 180 - burst_s)); [ "$hi" -gt "$lo" ] || hi=$((lo + 1))
burst_at=$((lo + RANDOM % (hi - lo)))
echo "minutes $minutes, burst of ${burst_s} s at ${burst_at} s (seed $seed)"
echo "minute cpu_s rss_mib"
t0=$(date +%s.%N)
now() { python3 -c "import time; print(round(time.time() - $t0, 1))"; }
state=before on_at="" active_at="" off_at="" clear_at=""
next_min=60
while true; do
  t=$(now); ti=${t%.*}
  [ "$ti" -ge $((minutes * 60)) ] && break
  if [ "$state" = before ] && [ "$ti" -ge "$burst_at" ]; then
    for _ in 1 2 3 4 5 6 7 8; do setsid "$spin" "$burst_s" < <(echo go) >/dev/null 2>&1 & hogs+=($!); done
    on_at=$t; state=burst
  fi
  if [ "$state" = burst ]; then
    if [ -z "$active_at" ] && active; then active_at=$(now); fi
    if python3 -c "import sys; sys.exit(0 if $(now) >= $on_at + $burst_s else 1)"; then off_at=$(now); state=after; fi
  fi
  if [ "$state" = after ] && [ -z "$clear_at" ]; then
    if [ -z "$active_at" ] && active; then active_at=$(now); fi
    if [ -n "$active_at" ] && ! active; then clear_at=$(now); fi
  fi
  if [ "$ti" -ge "$next_min" ]; then
    echo "$((next_min / 60)) $(cpu_of) $(rss_of)"
    next_min=$((next_min + 60))
  fi
  sleep 1
done
esc=$(curl -s "http://127.0.0.1:$mport/metrics" | awk '/^pgbelow_escalation_cpu_seconds_total /{print $2}')
held=$(metric pgbelow_history_bytes)
cpu=$(cpu_of)
echo "pgbelow CPU: $cpu s over $((minutes * 60)) s: $(python3 -c "print(f'{100*$cpu/($minutes*60):.2f} % of one CPU; escalations {${esc:-0}} s ({100*${esc:-0}/max($cpu,1e-9):.0f} % of it)')")"
echo "burst: on at $on_at s, finding active at ${active_at:-never} s, burst off at ${off_at:-?} s, cleared at ${clear_at:-never} s"
[ -n "$active_at" ] && echo "onset → active: $(python3 -c "print(round($active_at - $on_at, 1))") s"
[ -n "$clear_at" ] && echo "off → cleared: $(python3 -c "print(round($clear_at - $off_at, 1))") s"
echo "history held: ${held:-?} bytes; kept: $(du -sb "$dir/kept" | cut -f1) bytes in $(ls "$dir/kept" | wc -l) incident(s)"
for k in "$dir"/kept/watch-*; do
  [ -d "$k" ] || continue
  python3 - "$k" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1] + "/manifest.json"))
i = m.get("incident") or {}
r = json.load(open(sys.argv[1] + "/report.json"))
found = [f["id"] + ":" + f["severity"] for f in r["findings"]]
parts = ", ".join(f'{p["t_start"]}-{p["t_end"]}{" esc" if p["escalated"] else ""}' for p in i.get("parts", []))
print(f'incident {sys.argv[1].rsplit("/",1)[1]}: trigger {i.get("trigger_id")} onset_t {i.get("onset_t")} s '
      f'({"holds" if i.get("onset_t", 0) >= 30 else "LACKS"} 30 s before the onset); parts {parts}; findings {found}')
EOF
done
grep -E "trigger|kept|not kept|escalat" "$dir/watch.log" | head -20
