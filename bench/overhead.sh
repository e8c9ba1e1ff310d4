#!/usr/bin/env bash
# Overhead of pgbelow's collectors on the observed server, measured the way
# it was measured by hand: pgbench select-only, 1 client, everything pinned
# to one CPU, alternating runs with collection off (--collectors none) and
# on (default collectors), plus the same workload with `strace -c` attached
# to the backend for reference. Prints per-run tps and the median ratios.
#
# usage: [ON_COLLECTORS=list] bench/overhead.sh [PAIRS=3] [DURATION=20] [extra lab args...]
# e.g.   bench/overhead.sh 3 20 --pg 13 --set statement_timeout=10s
#        ON_COLLECTORS=syscalls bench/overhead.sh 3 20     # one collector's cost
#        ON_COLLECTORS=offcpu bench/overhead.sh 3 20       # off-CPU (prints its BPF run time)
# Also prints, from the "on" runs' manifests, each collector's CPU seconds,
# pgbelow's CPU and peak RSS, and the recording's size per minute.
set -euo pipefail
pairs=${1:-3}; shift || true
dur=${1:-20}; shift || true
extra=("$@")
cd "$(dirname "$0")/.."
cargo build --release -q
bin=$PWD/target/release/pgbelow
work=$(mktemp -d /tmp/pgbelow-bench-XXXX)
trap 'rm -rf "$work"' EXIT

# Steady-state tps: median of pgbench's per-second progress, skipping the
# first 3 s (connection, strace attach) and the last second.
steady_tps() {
  python3 - "$1" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
t0 = rows[0]["t"] if rows else 0
vals = [r["tps"] for r in rows if r["t"] - t0 >= 3][:-1] or [r["tps"] for r in rows]
print(f"{statistics.median(vals):.1f}")
PY
}

run() { # mode -> prints tps
  local mode=$1 out="$work/$1-$RANDOM"
  local args=(lab run --scenario select-only --clients 1 --scale 10 --duration "$dur" --format json --out "$out" "${extra[@]}")
  case $mode in
    off)    taskset -c 0 "$bin" "${args[@]}" --collectors none >/dev/null ;;
    on)     taskset -c 0 "$bin" "${args[@]}" ${ON_COLLECTORS:+--collectors "$ON_COLLECTORS"} >/dev/null
            python3 - "$out" "$dur" >> "$work/costs.txt" <<'PY'
import json, os, sys
d, dur = sys.argv[1], float(sys.argv[2])
m = json.load(open(os.path.join(d, "manifest.json")))
size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if not f.startswith("report."))
cols = " ".join(f'{c["name"]}={c["cpu_s"]:.3f}s' for c in m["collectors"])
off = os.path.join(d, "offcpu.json")
if os.path.exists(off):
    o = json.load(open(off))
    cols += (f' (offcpu BPF run time {o["bpf_run_s"]:.3f} s = {100*o["bpf_run_s"]/m["duration_s"]:.2f}% of one CPU '
             f'in {o["bpf_runs"]} runs, {o["blocks"]} blocks >= {o["min_block_us"]} us)')
print(f'  on-run costs: pgbelow cpu {m["pgbelow_cpu_s"]:.3f} s over {m["duration_s"]:.1f} s '
      f'({100*m["pgbelow_cpu_s"]/m["duration_s"]:.2f}% of one CPU), peak RSS {m.get("pgbelow_peak_rss_kb",0)/1024:.1f} MiB, '
      f'recording {size/1e6*60/m["duration_s"]:.2f} MB/min; collectors: {cols}')
PY
            ;;
    strace)
      taskset -c 0 "$bin" "${args[@]}" --collectors none >/dev/null &
      local lab=$!
      local pm="" be=""
      for _ in $(seq 600); do
        [ -f "$out/manifest.json" ] && pm=$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))["postgres"]["postmaster_pid"])' "$out/manifest.json") && break
        sleep 0.1
      done
      for _ in $(seq 100); do
        be=$(pgrep -P "$pm" -f 'postgres: .* bench ' | head -1 || true)
        [ -n "$be" ] && break
        sleep 0.05
      done
      taskset -c 0 strace -c -f -p "$be" -o "$work/strace-$RANDOM.txt" 2>/dev/null &
      local st=$!
      wait "$lab"
      kill "$st" 2>/dev/null || true; wait "$st" 2>/dev/null || true
      ;;
  esac
  steady_tps "$out/progress.jsonl"
}

echo "pairs=$pairs duration=${dur}s extra=${extra[*]:-none} kernel=$(uname -r) cpus=$(nproc)"
offs=(); ons=(); strs=()
for i in $(seq "$pairs"); do
  off=$(run off); on=$(run on); st=$(run strace)
  echo "pair $i: off $off tps · on $on tps · strace $st tps"
  offs+=("$off"); ons+=("$on"); strs+=("$st")
done
cat "$work/costs.txt"
python3 - "${offs[*]}" "${ons[*]}" "${strs[*]}" <<'PY'
import sys, statistics
off, on, st = ([float(x) for x in a.split()] for a in sys.argv[1:4])
r_on = statistics.median(o / f for o, f in zip(on, off))
r_st = statistics.median(s / f for s, f in zip(st, off))
print(f"median tps ratio on/off: {r_on:.3f}   strace -c/off: {r_st:.3f}")
PY
