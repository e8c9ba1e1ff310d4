#!/bin/sh
# Seed corpora (fuzz/corpus/<target>/seed-*) from the real fixtures in
# tests/fixtures; streams are cut to their first lines to keep seeds small.
# Run from the repository root: sh fuzz/seeds.sh
set -eu
F=tests/fixtures
C=fuzz/corpus
rm -rf "$C"
seed() { # target name source...
    mkdir -p "$C/$1"
    t=$1; n=$2; shift 2
    cat "$@" > "$C/$t/seed-$n"
}
for s in progress processes syscalls pgstat procfs system checkpoints; do
    for f in $F/recordings/*/$s.jsonl; do
        [ -f "$f" ] || continue
        d=$(basename "$(dirname "$f")")
        mkdir -p "$C/jsonl_$s"; head -n 4 "$f" > "$C/jsonl_$s/seed-$d"
    done
done
for s in waits server; do
    for f in $F/recordings/*/pgstat_$s.jsonl; do
        d=$(basename "$(dirname "$f")")
        mkdir -p "$C/jsonl_$s"; head -n 4 "$f" > "$C/jsonl_$s/seed-$d"
    done
done
mkdir -p $C/jsonl_activity $C/querytext
cp $F/pgstat/activity-pg15.jsonl $C/jsonl_activity/seed-pg15
# One captured pg_stat_activity text per seed.
i=0
while IFS= read -r q; do
    i=$((i + 1)); printf '%s' "$q" > "$C/querytext/seed-$i"
done < $F/pgstat/activity-queries-pg15.txt
for s in workload clock explain drop drop_sweep syncrep_sweep fsync manifest; do
    for f in $F/recordings/*/$s.json; do
        [ -f "$f" ] || continue
        t=json_$s; [ $s = manifest ] && t=manifest
        seed $t "$(basename "$(dirname "$f")")" "$f"
    done
done
for s in cgroup offcpu offcpu.stacks profile profile.stacks; do
    t=jsonl_$(echo $s | tr . _)
    for f in $F/recordings/*/$s.jsonl; do
        [ -f "$f" ] || continue
        mkdir -p "$C/$t"; head -n 4 "$f" > "$C/$t/seed-$(basename "$(dirname "$f")")"
    done
done
# No recording fixture has profile.stacks.jsonl: one captured from a real
# `lab run --scenario select-only --collectors profile` (PostgreSQL 15).
seed jsonl_profile_stacks pg15-select-only $F/profile/stacks-pg15-select-only.jsonl
for f in $F/recordings/*/offcpu.json; do seed json_offcpu_summary "$(basename "$(dirname "$f")")" "$f"; done
for f in $F/proc/cgroup-*; do seed cgroup_files "$(basename "$f")" "$f"; done
for f in $F/recordings/*/profile.json; do seed json_profile_summary "$(basename "$(dirname "$f")")" "$f"; done
for f in $F/recordings/*/profile.folded; do
    d=$(basename "$(dirname "$f")"); mkdir -p $C/folded; head -n 20 "$f" > "$C/folded/seed-$d"
done
mkdir -p $C/capped_lines
for f in $F/recordings/pg15-checkpoint-stall/*.jsonl; do
    { printf '\020'; head -n 3 "$f"; } > "$C/capped_lines/seed-$(basename "$f")"
done
# Whole recordings: each file's first lines after a marker naming it (fuzz/src/lib.rs).
mkdir -p $C/recording
files="manifest.json workload.json progress.jsonl processes.jsonl syscalls.jsonl pgstat.jsonl procfs.jsonl system.jsonl pgstat_waits.jsonl pgstat_server.jsonl checkpoints.jsonl profile.json profile.folded clock.json explain.json drop.json drop_sweep.json syncrep_sweep.json flamegraph-backend.svg cgroup.jsonl offcpu.json offcpu.folded offcpu.jsonl offcpu.stacks.jsonl profile.jsonl profile.stacks.jsonl pgstat_activity.jsonl"
for d in $F/recordings/*/; do
    out="$C/recording/seed-$(basename "$d")"
    i=0; : > "$out"
    for name in $files; do
        if [ -f "$d$name" ]; then
            [ $i -gt 0 ] && printf '\n@@pgbelow-file %d\n' $i >> "$out"
            head -n 5 "$d$name" >> "$out"
        fi
        i=$((i + 1))
    done
done
for k in stat stack wchan syscall io schedstat status; do
    for f in $F/proc/${k}_*; do seed proc_$k "$(basename "$f")" "$f"; done
done
seed proc_meminfo_vmstat meminfo $F/proc/meminfo
seed proc_meminfo_vmstat vmstat $F/proc/vmstat
seed proc_mountinfo mountinfo $F/proc/mountinfo
for f in $F/proc/maps_* ; do seed proc_maps "$(basename "$f")" "$f"; done
seed proc_kallsyms kallsyms $F/proc/kallsyms_head
for f in $F/proc/cmdline_*; do seed proc_cmdline "$(basename "$f")" "$f"; done
seed proc_children_cpulist children $F/proc/children_postmaster
seed proc_children_cpulist cpu_online $F/proc/cpu_online
for f in $F/pgbench/*.stderr; do seed pgbench_progress "$(basename "$f")" "$f"; done
for f in $F/pgbench/*.stdout $F/pgbench/*.stderr; do
    [ -s "$f" ] && seed pgbench_summary "$(basename "$f")" "$f"
done
for f in $F/serverlog/*.log; do seed serverlog "$(basename "$f")" "$f"; done
for f in $F/connect/conninfo_*; do seed conninfo "$(basename "$f")" "$f"; done
seed pgpass pgpass $F/connect/pgpass
