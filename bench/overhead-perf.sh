#!/usr/bin/env bash
# Where the observer's cost goes, by CPU time rather than by throughput:
# tps on this shared VM moves ±10-15 % between identical runs, so a few per
# cent cannot be resolved by bench/overhead.sh; CPU samples can. A cluster
# started with initdb/pg_ctl and pgbench -S -M prepared -c 1 run pinned to
# CPU 0 (as bench/overhead.sh does), then for each configuration
# `pgbelow record --collectors LIST` attached (pinned to CPU 0 too) while
# `perf record -C 0` samples CPU 0 at 2 kHz for SECONDS in the middle of the
# recording. Only the samples of the workload's processes (the cluster's,
# pgbench's) and pgbelow's are counted, so other load on the machine does
# not enter the shares. Per configuration it prints the share of those
# samples spent on observing:
#   pgbelow     pgbelow's own threads (user and kernel)
#   sessions    the backends of pgbelow's own connections (application_name
#               pgbelow): its queries' cost inside the server
#   bpf         BPF programs and their dispatch (bpf_prog_*, bpf_trace_run*)
#   tracepoint  the syscall slow path a syscall tracepoint puts every task on
#               (syscall_trace_enter, x64_sys_call, syscall_exit_work) and
#               the per-syscall tracepoints' filter (perf_syscall_*)
#   perf        perf sampling (perf_*: the profile collector's samples)
#   procfs      /proc reads' kernel work done for pgbelow (in pgbelow)
# and the total, which is the throughput a CPU-bound pinned workload loses.
#
# usage: bench/overhead-perf.sh [SECONDS=8] [CONFIG ...]   (CONFIG: a --collectors list)
# PGBELOW_ARGS: more `pgbelow record` options for every configuration
# (e.g. --syscalls-budget 100 to count every system call).
# The server listens on localhost's TCP port as a user's does
# (LISTEN_ADDRESSES= for the Unix socket only, as before 2026-12-03).
set -euo pipefail
secs=${1:-8}; shift || true
cd "$(dirname "$0")/.."
cargo build --release -q
bin=$PWD/target/release/pgbelow
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
default=$(sed -n '/^pub const DEFAULT: &\[&str\] = &\[/,/\];/p' crates/capture/src/collect/mod.rs | tr -d '\n" ' | sed 's/.*=&\[\(.*\)\];/\1/;s/,$//')
[ $# -gt 0 ] && configs=("$@") || configs=(none "$default")
work=$(mktemp -d /tmp/pgbelow-bench-XXXX)
chown postgres "$work"
port=$((20000 + RANDOM % 20000))
cleanup() {
  [ -n "${bench_pid:-}" ] && kill "$bench_pid" 2>/dev/null || true
  runuser -u postgres -- "$pgbin/pg_ctl" -D "$work/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
runuser -u postgres -- "$pgbin/initdb" -A trust -U postgres -D "$work/data" >/dev/null
taskset -c 0 runuser -u postgres -- "$pgbin/pg_ctl" -D "$work/data" -l "$work/log" -w \
  -o "-p $port -k $work -c listen_addresses='${LISTEN_ADDRESSES-localhost}'" start >/dev/null
pm=$(head -1 "$work/data/postmaster.pid")
"$pgbin/pgbench" -h "$work" -p "$port" -U postgres -i -s 10 -q postgres 2>/dev/null
taskset -c 0 "$pgbin/pgbench" -h "$work" -p "$port" -U postgres -S -M prepared -c 1 \
  -T 100000 postgres >/dev/null 2>&1 &
bench_pid=$!
sleep 3
echo "seconds=$secs default=$default args=${PGBELOW_ARGS:-} $("$pgbin/postgres" --version) kernel=$(uname -r) load=$(cut -d' ' -f1-3 /proc/loadavg)"
echo "| collectors | samples | pgbelow | its sessions | bpf | tracepoint | perf | total observing |"
echo "|---|---|---|---|---|---|---|---|"
for c in "${configs[@]}"; do
  list=$c; [ "$c" = none ] && list=none
  out="$work/rec-$RANDOM"
  taskset -c 0 "$bin" record --pid "$pm" --dsn "host=$work port=$port user=postgres dbname=postgres" \
    --duration $((secs + 6)) --collectors "$list" ${PGBELOW_ARGS:-} --format json --out "$out" >/dev/null 2>&1 &
  rec=$!
  sleep 3
  pids=$( (pgrep -P "$pm"; echo "$pm"; pgrep -P "$bench_pid"; echo "$bench_pid"; echo "$rec") | sort -u | paste -sd,)
  # pgbelow's own sessions' backends are part of its cost, not the workload.
  own_backends=$("$pgbin/psql" -h "$work" -p "$port" -U postgres -Atc \
    "select string_agg(pid::text, ',') from pg_stat_activity where application_name like 'pgbelow%'" postgres 2>/dev/null || true)
  perf record -q -C 0 -F 2000 -o "$work/perf.data" -- sleep "$secs" >/dev/null 2>&1
  wait "$rec" || true
  [ -n "${PERF_KEEP:-}" ] && cp "$work/perf.data" "$PERF_KEEP.$(echo "$c" | tr , _)"
  perf report -i "$work/perf.data" --pid "$pids" --no-children -g none --sort pid,sym -n \
    --stdio -t $'\t' 2>/dev/null | grep -v '^#' | grep -v '^$' > "$work/rows.txt" || true
  python3 - "$work/rows.txt" "$c" "${own_backends:-}" <<'PY'
import sys
own_pids = {p for p in sys.argv[3].split(",") if p}
rows = []
for l in open(sys.argv[1]):
    parts = [p.strip() for p in l.rstrip("\n").split("\t")]
    if len(parts) < 4 or not parts[0].endswith("%"):
        continue
    pid, _, comm = parts[2].partition(":")
    rows.append((int(parts[1]), pid.strip(), comm, parts[3]))
tot = sum(r[0] for r in rows) or 1
def share(pred):
    return 100 * sum(n for n, pid, comm, sym in rows if pred(pid, comm, sym)) / tot
# pgbelow's threads, and its own sessions' backends (application_name
# pgbelow): their work is the observer's, not the workload's.
own = lambda pid, comm, sym: comm.startswith("pgbelow") or pid in own_pids
sess = share(lambda p, c, s: p in own_pids)
bpf = share(lambda p, c, s: not own(p, c, s) and ("bpf_prog_" in s or "bpf_trace_run" in s))
tp = share(lambda p, c, s: not own(p, c, s) and any(k in s for k in ("syscall_trace_enter", "x64_sys_call", "trace_sys_enter", "syscall_exit_work", "perf_syscall")))
perf = share(lambda p, c, s: not own(p, c, s) and "perf_" in s and "perf_syscall" not in s)
pg = share(own)
print(f"| {sys.argv[2]} | {tot} | {pg - sess:.2f} % | {sess:.2f} % | {bpf:.2f} % | {tp:.2f} % | {perf:.2f} % | **{pg + bpf + tp + perf:.2f} %** |")
PY
done
