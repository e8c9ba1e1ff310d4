#!/usr/bin/env bash
# Where the default recording's cost goes: the pinned select-only pair of
# bench/overhead.sh (pgbench -S -M prepared, 1 client, scale 10, the whole
# lab run on CPU 0), run with no collectors, the default set, each default
# collector alone and the default set less each one, in rounds, so every
# configuration is compared with the "none" run of its own round.
#
# Prints per configuration: the median tps ratio against "none", the
# observed processes' CPU per transaction (the backends, from the
# recording's procfs section where procfs ran), pgbelow's own CPU, and the
# in-kernel run time of the BPF programs (kernel.bpf_stats_enabled is turned
# on for the bench and restored afterwards; the syscall collector records
# its programs' run time in its manifest entry).
#
# usage: bench/overhead-by-collector.sh [ROUNDS=2] [DURATION=15] [extra lab args...]
set -euo pipefail
rounds=${1:-2}; shift || true
dur=${1:-15}; shift || true
extra=("$@")
cd "$(dirname "$0")/.."
cargo build --release -q
bin=$PWD/target/release/pgbelow
work=$(mktemp -d /tmp/pgbelow-bench-XXXX)
stats_was=$(cat /proc/sys/kernel/bpf_stats_enabled)
trap 'echo "$stats_was" > /proc/sys/kernel/bpf_stats_enabled; rm -rf "$work"' EXIT
echo 1 > /proc/sys/kernel/bpf_stats_enabled

# The default set (src/collect/mod.rs DEFAULT); DEFAULT= overrides it.
default=${DEFAULT:-$(sed -n 's/^pub const DEFAULT: &\[&str\] = &\[\(.*\)\];/\1/p' src/collect/mod.rs | tr -d '" ')}
IFS=, read -r -a cols <<<"$default"
configs=(none "$default")
for c in "${cols[@]}"; do configs+=("$c"); done
for c in "${cols[@]}"; do
  rest=$(printf '%s\n' "${cols[@]}" | grep -vx "$c" | paste -sd,)
  configs+=("-$c:$rest")
done

run() { # label collectors round -> appends a JSON line to results
  local label=$1 list=$2 round=$3 out="$work/run-$RANDOM$RANDOM"
  taskset -c 0 "$bin" lab run --scenario select-only --clients 1 --scale 10 \
    --duration "$dur" --format json --out "$out" --collectors "$list" "${extra[@]}" >/dev/null
  python3 - "$out" "$label" "$round" >> "$work/results.jsonl" <<'PY'
import json, os, sys, statistics
d, label, rnd = sys.argv[1:4]
rows = [json.loads(l) for l in open(os.path.join(d, "progress.jsonl")) if l.strip()]
t0 = rows[0]["t"] if rows else 0
vals = [r["tps"] for r in rows if r["t"] - t0 >= 3][:-1] or [r["tps"] for r in rows]
m = json.load(open(os.path.join(d, "manifest.json")))
r = json.load(open(os.path.join(d, "report.json")))
w = r.get("workload") or {}
tx = w.get("transactions") or 0
roles = ((r.get("procfs") or {}).get("roles") or {})
obs = sum((roles.get(k) or {}).get("cpu_s", 0) for k in ("backend",))
bpf = sum(c.get("bpf_run_s") or 0 for c in m["collectors"])
print(json.dumps({"label": label, "round": int(rnd), "tps": statistics.median(vals),
                  "obs_us_per_tx": (1e6 * obs / tx) if tx and obs else None,
                  "pgbelow_cpu_s": m.get("pgbelow_cpu_s"), "bpf_run_s": bpf,
                  "cols": {c["name"]: c["cpu_s"] for c in m["collectors"]}}))
PY
}

echo "rounds=$rounds duration=${dur}s default=$default kernel=$(uname -r) cpus=$(nproc) load=$(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$rounds"); do
  for c in "${configs[@]}"; do
    label=${c%%:*}; list=${c#*:}
    [ "$c" = "$default" ] && label=default
    run "$label" "$list" "$r"
    tail -n1 "$work/results.jsonl"
  done
done
python3 - "$work/results.jsonl" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
base = {r["round"]: r["tps"] for r in rows if r["label"] == "none"}
order = []
for r in rows:
    if r["label"] not in order:
        order.append(r["label"])
print("| collectors | tps (median) | on/none per round | median | observed µs/tx | pgbelow CPU s | BPF run s |")
print("|---|---|---|---|---|---|---|")
for lab in order:
    rs = [r for r in rows if r["label"] == lab]
    ratios = [r["tps"] / base[r["round"]] for r in rs]
    obs = [r["obs_us_per_tx"] for r in rs if r["obs_us_per_tx"]]
    fmt = lambda xs, f: (f % statistics.median(xs)) if xs else "–"
    print(f"| {lab} | {statistics.median(r['tps'] for r in rs):,.0f} | {' '.join(f'{x:.3f}' for x in ratios)} "
          f"| **{statistics.median(ratios):.3f}** | {fmt(obs, '%.1f')} "
          f"| {fmt([r['pgbelow_cpu_s'] or 0 for r in rs], '%.3f')} | {fmt([r['bpf_run_s'] for r in rs], '%.3f')} |")
PY
