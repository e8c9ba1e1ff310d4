#!/usr/bin/env bash
# The flight recorder over a long run: `pgbelow watch` (default window,
# history, budget and collectors, --keep) on a cluster under a steady
# pgbench load, with transient causes injected one after another, each at a
# random second of its own slice of the run (INJECT, default all three):
#   cpu         8 busy loops for 40 s, each in its own session as another
#               service's would be                    → cpu-saturation
#   iops        the cluster's reads from its disk limited to 150 a second
#               (a blkio cgroup) with its tables evicted from the page
#               cache, for 60 s                      → disk-read-latency
#   checkpoint  an immediate CHECKPOINT while the hot table's device (a
#               loop device, as the lab's stall device) writes at most
#               1 MB/s with an 8 MB dirty cap, for 20 s
#                                                    → checkpoint-writeback-stall
# The load: 300 select-only and 1,000 upsert transactions a second (the
# upserts into a table on the loop device, as seed 001's).
# Prints pgbelow's CPU and RSS every minute, then: its mean CPU share, the
# escalations' share of it, the RSS slope, the bytes kept and held, and per
# injection the seconds from its start to pgbelow_finding_active{id=…} = 1
# and from its end back to 0, and whether a kept incident holds at least
# 30 s before the onset.
# Usage (root): bench/watch-flight.sh [MINUTES] [PGBELOW_BINARY] [SEED]
# The server listens on localhost's TCP port as a user's does
# (LISTEN_ADDRESSES= for the Unix socket only, as before 2026-12-03).
set -euo pipefail
minutes=${1:-60}
bin=$(realpath "${2:-target/release/pgbelow}")
seed=${3:-$RANDOM}
spin=$(dirname "$bin")/pgbelow-spin
read -r -a inject <<<"${INJECT:-cpu iops checkpoint}"
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
dir=$(mktemp -d /tmp/pgbelow-bench-flight-XXXXXX)
chmod 755 "$dir"
chown postgres: "$dir"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
as_pg() { runuser -u postgres -- "$@"; }
psql_q() { psql -X -q -h "$dir" -p "$port" -U postgres -d postgres -Atc "$1"; }
blkio=/sys/fs/cgroup/blkio
hogs=() loads=()
loopdev="" mm="" iops_cg="$blkio/pgbelow-bench-iops-$$"
lift_write_limit() {
  [ -n "$mm" ] || return 0
  echo "$mm 0" >"$blkio/blkio.throttle.write_bps_device" 2>/dev/null || true
  echo 0 >"/sys/class/bdi/$mm/strict_limit" 2>/dev/null || true
  echo 100 >"/sys/class/bdi/$mm/max_ratio" 2>/dev/null || true
}
lift_read_limit() {
  [ -d "$iops_cg" ] || return 0
  while read -r p; do echo "$p" >"$blkio/cgroup.procs" 2>/dev/null || true; done <"$iops_cg/cgroup.procs"
  rmdir "$iops_cg" 2>/dev/null || true
}
cleanup() {
  for h in "${hogs[@]}"; do kill "$h" 2>/dev/null || true; done
  lift_write_limit
  lift_read_limit
  [ -n "${wpid:-}" ] && kill -TERM "$wpid" 2>/dev/null && wait "$wpid" 2>/dev/null || true
  for l in "${loads[@]}"; do kill "$l" 2>/dev/null || true; done
  as_pg "$pgbin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
  if [ -n "$loopdev" ]; then
    umount "$dir/mnt" 2>/dev/null || true
    losetup -d "$loopdev" 2>/dev/null || true
  fi
  cp "$dir/watch.log" /tmp/watch-flight-last.log 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
as_pg "$pgbin/initdb" -A trust -U postgres -D "$dir/data" >/dev/null
# flush_after 0: a checkpoint's writes stay dirty in the page cache until
# the kernel writes them back, as seed 001's.
as_pg "$pgbin/pg_ctl" -w -D "$dir/data" -l "$dir/log" -o "-k $dir -p $port -c listen_addresses='${LISTEN_ADDRESSES-localhost}' \
  -c checkpoint_flush_after=0 -c backend_flush_after=0 -c bgwriter_flush_after=0 \
  -c max_wal_size=4GB" start >/dev/null
pgbench -h "$dir" -p "$port" -U postgres -i -q -s 30 postgres >/dev/null 2>&1
# The hot table's own device.
truncate -s 2G "$dir/disk.img"
loopdev=$(losetup --find --show "$dir/disk.img")
mkfs.ext4 -q -F "$loopdev"
mkdir "$dir/mnt" && mount "$loopdev" "$dir/mnt" && mkdir "$dir/mnt/ts" && chown postgres: "$dir/mnt/ts"
mm=$(cat "/sys/block/${loopdev#/dev/}/dev")
psql_q "create tablespace bench_hot location '$dir/mnt/ts'"
psql_q "create table hot (id int primary key using index tablespace bench_hot, info text, t timestamptz) tablespace bench_hot"
printf '%s\n' '\set id random(1, 100000000)' \
  'insert into hot values (:id, md5(random()::text), now()) on conflict (id) do update set info = excluded.info, t = excluded.t;' >"$dir/upsert.sql"
disk=$(python3 -c "import os; st=os.stat('$dir/data'); print(f'{os.major(st.st_dev)}:{os.minor(st.st_dev)}')")
# Limits apply to the whole disk, not a partition.
[ -e "/sys/dev/block/$disk/partition" ] && disk=$(cat "/sys/dev/block/$disk/../dev")
secs=$((minutes * 60 + 60))
pgbench -h "$dir" -p "$port" -U postgres -S -M prepared -c 2 -j 1 -R "${SELECT_RATE:-300}" -T "$secs" postgres >"$dir/select.out" 2>&1 &
loads+=($!)
pgbench -h "$dir" -p "$port" -U postgres -n -f "$dir/upsert.sql" -M prepared -c 4 -j 1 -R "${UPSERT_RATE:-1000}" -T "$secs" postgres >"$dir/upsert.out" 2>&1 &
loads+=($!)
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
  w=$(metric "pgbelow_finding_active{id=\"$1\",severity=\"warning\"}")
  c=$(metric "pgbelow_finding_active{id=\"$1\",severity=\"critical\"}")
  [ "${w:-0}" = 1 ] || [ "${c:-0}" = 1 ]
}
finding_of() { case $1 in cpu) echo cpu-saturation ;; iops) echo disk-read-latency ;; checkpoint) echo checkpoint-writeback-stall ;; esac; }
duration_of() { case $1 in cpu) echo "${BURST_S:-40}" ;; iops) echo 60 ;; checkpoint) echo 20 ;; esac; }
start_inject() {
  case $1 in
    cpu)
      for _ in 1 2 3 4 5 6 7 8; do setsid "$spin" "$(duration_of cpu)" < <(echo go) >/dev/null 2>&1 & hogs+=($!); done ;;
    iops)
      mkdir "$iops_cg"
      echo "$disk 150" >"$iops_cg/blkio.throttle.read_iops_device"
      for p in $(head -1 "$dir/data/postmaster.pid") $(pgrep -P "$(head -1 "$dir/data/postmaster.pid")"); do
        echo "$p" >"$iops_cg/cgroup.procs" 2>/dev/null || true
      done
      sync
      python3 - "$dir/data/base" <<'EOF'
import os, sys
for db in os.listdir(sys.argv[1]):
    for f in os.listdir(os.path.join(sys.argv[1], db)):
        try:
            fd = os.open(os.path.join(sys.argv[1], db, f), os.O_RDONLY)
        except OSError:
            continue
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
EOF
      ;;
    checkpoint)
      echo "$mm $((1 << 20))" >"$blkio/blkio.throttle.write_bps_device"
      echo 1 >"/sys/class/bdi/$mm/strict_limit"
      echo $((8 << 20)) >"/sys/class/bdi/$mm/max_bytes"
      (psql_q checkpoint >/dev/null 2>&1 &) ;;
  esac
}
stop_inject() {
  case $1 in
    cpu) ;; # the loops end by themselves
    iops) lift_read_limit ;;
    checkpoint) lift_write_limit ;;
  esac
}
# Each injection at a random second of its own slice, 3 minutes from the
# slice's start (so the trailing medians and the history are full) and
# clear of its end by its duration plus 2 minutes (so it can clear).
RANDOM=$seed
n=${#inject[@]}
slice=$((minutes * 60 / n))
at=()
for i in "${!inject[@]}"; do
  d=$(duration_of "${inject[$i]}")
  lo=$((i * slice + 180)); hi=$(((i + 1) * slice - d - 120)); [ "$hi" -gt "$lo" ] || hi=$((lo + 1))
  at+=($((lo + RANDOM % (hi - lo))))
done
echo "minutes $minutes, seed $seed"
for i in "${!inject[@]}"; do echo "inject ${inject[$i]} ($(duration_of "${inject[$i]}") s) at ${at[$i]} s → $(finding_of "${inject[$i]}")"; done
echo "minute cpu_s rss_mib"
t0=$(date +%s.%N)
now() { python3 -c "import time; print(round(time.time() - $t0, 1))"; }
declare -A on_at active_at off_at clear_at
cur=0 state=before
next_min=60
while true; do
  t=$(now); ti=${t%.*}
  [ "$ti" -ge $((minutes * 60)) ] && break
  if [ "$cur" -lt "$n" ]; then
    k=${inject[$cur]} id=$(finding_of "${inject[$cur]}")
    if [ "$state" = before ] && [ "$ti" -ge "${at[$cur]}" ]; then
      start_inject "$k"; on_at[$k]=$t; state=on
    fi
    if [ "$state" = on ]; then
      if [ -z "${active_at[$k]:-}" ] && active "$id"; then active_at[$k]=$(now); fi
      if python3 -c "import sys; sys.exit(0 if $(now) >= ${on_at[$k]} + $(duration_of "$k") else 1)"; then
        stop_inject "$k"; off_at[$k]=$(now); state=after
      fi
    fi
    if [ "$state" = after ]; then
      if [ -z "${active_at[$k]:-}" ] && active "$id"; then active_at[$k]=$(now); fi
      if [ -n "${active_at[$k]:-}" ] && ! active "$id"; then clear_at[$k]=$(now); fi
      # Done with this one once cleared, or when its slice is over.
      if [ -n "${clear_at[$k]:-}" ] || [ "$ti" -ge $(((cur + 1) * slice)) ]; then cur=$((cur + 1)); state=before; fi
    fi
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
for k in "${inject[@]}"; do
  line="$k ($(finding_of "$k")): on at ${on_at[$k]:-?} s, finding active at ${active_at[$k]:-never} s, off at ${off_at[$k]:-?} s, cleared at ${clear_at[$k]:-never} s"
  [ -n "${active_at[$k]:-}" ] && line+="; onset → active $(python3 -c "print(round(${active_at[$k]} - ${on_at[$k]}, 1))") s"
  [ -n "${clear_at[$k]:-}" ] && line+="; off → cleared $(python3 -c "print(round(${clear_at[$k]} - ${off_at[$k]}, 1))") s"
  echo "$line"
done
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
grep -E "trigger|kept|not kept|escalat" "$dir/watch.log" | head -30
