#!/usr/bin/env bash
# The observer's cost per collector, measured on ONE running server so that
# the between-runs noise of bench/overhead.sh (a new cluster, new memory
# layout and a new backend per run: ±10-15 % between identical runs here)
# does not drown a few per cent: a cluster started with initdb/pg_ctl, pinned
# to CPU 0 with pgbench -S -M prepared -c 1 (also on CPU 0) running
# throughout with per-second progress, and `pgbelow record` (on CPU 0 too)
# attached for ON seconds, then detached for OFF seconds, cycling through
# the configurations. Each window's tps (median of its whole seconds, the
# first and last second of each window and the recording's end work dropped) is compared with the
# median of the detached seconds just before and just after it.
#
# Prints per configuration: the on/off ratio of each window, their median,
# pgbelow's own CPU, each collector's CPU and its BPF programs' in-kernel
# run time (with BPF_STATS=1: kernel.bpf_stats_enabled on for the bench, restored after), and
# the backend's CPU per transaction from procfs where it ran. bench/overhead-perf.sh
# attributes the cost by CPU samples instead, which this VM's noise does not move.
#
# usage: bench/overhead-alternating.sh [REPS=4] [ON=8] [OFF=5] [CONFIG ...]
#   CONFIG: a --collectors list; default: none, the default set, each
#   default collector alone, the default set less each one.
# The server listens on localhost's TCP port as a user's does
# (LISTEN_ADDRESSES= for the Unix socket only, as before 2026-12-03).
set -euo pipefail
reps=${1:-4}; shift || true
on=${1:-8}; shift || true
off=${1:-5}; shift || true
cd "$(dirname "$0")/.."
cargo build --release -q
bin=$PWD/target/release/pgbelow
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
work=$(mktemp -d /tmp/pgbelow-bench-XXXX)
chown postgres "$work"
stats_was=$(cat /proc/sys/kernel/bpf_stats_enabled)
port=$((20000 + RANDOM % 20000))
cleanup() {
  echo "$stats_was" > /proc/sys/kernel/bpf_stats_enabled
  [ -n "${bench_pid:-}" ] && kill "$bench_pid" 2>/dev/null || true
  runuser -u postgres -- "$pgbin/pg_ctl" -D "$work/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
# BPF statistics stay as they are: on, they add two clock reads to every
# program run and so inflate what is measured (BPF_STATS=1 turns them on for
# the BPF run-time column).
[ "${BPF_STATS:-0}" = 1 ] && echo 1 > /proc/sys/kernel/bpf_stats_enabled

default=${DEFAULT:-$(sed -n 's/^pub const DEFAULT: &\[&str\] = &\[\(.*\)\];/\1/p' crates/capture/src/collect/mod.rs | tr -d '" ')}
IFS=, read -r -a cols <<<"$default"
if [ $# -gt 0 ]; then
  configs=("$@")
else
  configs=("$default")
  for c in "${cols[@]}"; do configs+=("$c"); done
  for c in "${cols[@]}"; do
    configs+=("$(printf '%s\n' "${cols[@]}" | grep -vx "$c" | paste -sd,)")
  done
fi

runuser -u postgres -- "$pgbin/initdb" -A trust -U postgres -D "$work/data" >/dev/null
taskset -c 0 runuser -u postgres -- "$pgbin/pg_ctl" -D "$work/data" -l "$work/log" -w \
  -o "-p $port -k $work -c listen_addresses='${LISTEN_ADDRESSES-localhost}'" start >/dev/null
pm=$(head -1 "$work/data/postmaster.pid")
"$pgbin/pgbench" -h "$work" -p "$port" -U postgres -i -s 10 -q postgres 2>/dev/null
total=$(( (${#configs[@]} * reps) * (on + off + 6) + 60 ))
taskset -c 0 "$pgbin/pgbench" -h "$work" -p "$port" -U postgres -S -M prepared -c 1 \
  -T "$total" -P 1 --progress-timestamp postgres 2> "$work/progress" >/dev/null &
bench_pid=$!
sleep "$off"
echo "reps=$reps on=${on}s off=${off}s default=$default postgres=$("$pgbin/postgres" --version) kernel=$(uname -r) cpus=$(nproc) load=$(cut -d' ' -f1-3 /proc/loadavg)"
: > "$work/windows"
for r in $(seq "$reps"); do
  for c in "${configs[@]}"; do
    out="$work/rec-$RANDOM$RANDOM"
    t0=$(date +%s.%N)
    taskset -c 0 "$bin" record --pid "$pm" --dsn "host=$work port=$port user=postgres dbname=postgres" \
      --duration "$on" --collectors "$c" --format json --out "$out" >/dev/null 2>"$out.err" || { cat "$out.err"; exit 1; }
    t1=$(date +%s.%N)
    echo "$r $c $t0 $t1 $out" >> "$work/windows"
    sleep "$off"
  done
done
kill "$bench_pid" 2>/dev/null || true; wait "$bench_pid" 2>/dev/null || true
python3 - "$work/progress" "$work/windows" "$on" <<'PY'
import json, os, re, statistics, sys
ON = float(sys.argv[3])
prog = []
for l in open(sys.argv[1]):
    m = re.match(r"progress: ([\d.]+) s, ([\d.]+) tps", l)
    if m:
        prog.append((float(m.group(1)), float(m.group(2))))  # second ending at t
wins = [l.split() for l in open(sys.argv[2])]
def med(a, b):
    # whole seconds [t-1, t] inside [a, b]
    v = [tps for t, tps in prog if t - 1 >= a and t <= b]
    return statistics.median(v) if v else None
rows = {}
for i, (r, c, t0, t1, out) in enumerate(wins):
    t0, t1 = float(t0), float(t1)
    # Collection runs from about t0 + 1 s (attached) for ON seconds; what
    # follows (symbols, the report) is the recording's end work, not its
    # cost while attached.
    on = med(t0 + 2.0, min(t0 + ON, t1))
    prev_end = float(wins[i - 1][3]) if i else t0 - 5
    next_start = float(wins[i + 1][2]) if i + 1 < len(wins) else t1 + 5
    before, after = med(prev_end + 1.0, t0), med(t1 + 1.0, next_start)
    offs = [x for x in (before, after) if x]
    if not on or not offs:
        continue
    m = json.load(open(os.path.join(out, "manifest.json")))
    rep = json.load(open(os.path.join(out, "report.json")))
    be = ((rep.get("procfs") or {}).get("roles") or {}).get("backend") or {}
    cols = {x["name"]: (x["cpu_s"], x.get("bpf_run_s")) for x in m["collectors"]}
    rows.setdefault(c, []).append({
        "ratio": on / statistics.mean(offs), "on": on, "off": statistics.mean(offs),
        "pgbelow_cpu_s": m.get("pgbelow_cpu_s") or 0, "dur": m.get("duration_s") or 0,
        "backend_cpu_s": be.get("cpu_s"), "cols": cols})
print("| collectors | on/off per window | median | tps off → on | pgbelow CPU % of one CPU | per collector CPU s (BPF run s) |")
print("|---|---|---|---|---|---|")
for c, rs in rows.items():
    ratios = [x["ratio"] for x in rs]
    cpu = statistics.median(100 * x["pgbelow_cpu_s"] / max(x["dur"], 1e-9) for x in rs)
    per = {}
    for x in rs:
        for n, (s, b) in x["cols"].items():
            per.setdefault(n, []).append((s, b))
    pc = " ".join(f"{n}={statistics.median(s for s, _ in v):.3f}" +
                  (f" ({statistics.median(b for _, b in v):.4f})" if all(b is not None for _, b in v) else "")
                  for n, v in per.items())
    print(f"| {c or 'none'} | {' '.join(f'{r:.3f}' for r in ratios)} | **{statistics.median(ratios):.3f}** "
          f"| {statistics.median(x['off'] for x in rs):,.0f} → {statistics.median(x['on'] for x in rs):,.0f} "
          f"| {cpu:.2f} | {pc} |")
PY
