#!/usr/bin/env bash
# How much of the backends' busy time the findings explain, per lab case
# against its healthy baseline (docs/accuracy.md, "The account"): each case
# is `pgbelow lab run` with its defaults (procfs and pgstat among the
# collectors), then the report's `explained` and the backends' largest
# slices. Prints one line per run.
# Usage (root): bench/account-cases.sh [PGBELOW_BINARY]
set -uo pipefail
bin=$(realpath "${1:-target/release/pgbelow}")
out=$(mktemp -d /var/tmp/pgbelow-account-cases-XXXXXX)
trap 'rm -rf "$out"' EXIT
run() {
  local name=$1; shift
  if ! "$bin" lab run --out "$out/$name" "$@" >/dev/null 2>"$out/$name.err"; then
    echo "$name: lab run failed: $(tail -1 "$out/$name.err")"
    return
  fi
  "$bin" report "$out/$name" --format json | python3 "$out/summary.py" "$name"
}
cat >"$out/summary.py" <<'EOF'
import json, sys
name = sys.argv[1]
r = json.load(sys.stdin)
ids = [f["id"] + ":" + f["severity"] for f in r["findings"]]
e = r.get("explained")
a = r.get("account") or {}
b = next((x for x in a.get("roles", []) if x["role"] == "backend"), None)
if not b:
    why = a.get("backends_unread") or "procfs not recorded"
    print(f"{name}: no account of the backends ({why}); findings {ids}")
    sys.exit()
busy = b.get("busy_s")
top = sorted((s for s in b["slices"] if s["key"] != "S:idle"), key=lambda s: -s["s"])[:3]
def show(s):
    return f"{s['key']} {100 * s['s'] / busy:.0f} %" if busy else f"{s['key']} {s['s']:.1f} s"
slices = ", ".join(show(s) for s in top)
if e:
    claims = ", ".join(f"{c['id']} {100 * c['share']:.0f} % ({'+'.join(c['slices'])})" for c in e["by_finding"])
    print(f"{name}: busy {e['busy_s']:.1f} s; explained {100 * e['explained_share']:.0f} % [{claims}]; "
          f"waiting unexplained {100 * e['unexplained_waiting_share']:.0f} %; on CPU unclaimed "
          f"{100 * e['on_cpu_unclaimed_share']:.0f} %; largest slices: {slices}; findings {ids}")
else:
    print(f"{name}: no busy time (pg_stat_activity not recorded); largest slices: {slices}; findings {ids}")
EOF
run noisy-neighbour --scenario noisy-neighbour
run noisy-neighbour-none --scenario noisy-neighbour --hogs 0
run disk-read-latency --scenario disk-read-latency
run disk-read-latency-none --scenario disk-read-latency --read-iops 0
run wal-fsync-latency --scenario wal-fsync-latency
run wal-fsync-latency-none --scenario wal-fsync-latency --write-limit 100000
run relation-extension --scenario relation-extension
run cgroup-cpu-throttling --scenario cgroup-cpu-throttling
run cgroup-cpu-throttling-none --scenario cgroup-cpu-throttling --cpu-quota 0
run memory-cgroup-reclaim --scenario memory-cgroup-reclaim
run swap-activity --scenario swap-activity
run checkpoint-stall --scenario checkpoint-stall
run syncrep-network-latency --scenario syncrep-network-latency
