#!/bin/sh
# Run fuzz targets one after another, RUNS executions each (the whole-
# recording target at most MAX_S seconds), and print one line per target:
# executions, seconds, and the crash artifact if any. From the repository
# root: sh fuzz/run-all.sh [target...]
set -u
RUNS=${RUNS:-1000000}
MAX_S=${MAX_S:-900}
cd fuzz
targets=${*:-$(cargo +nightly fuzz list)}
for t in $targets; do
    case $t in
        recording) len=65536; limit="-max_total_time=$MAX_S" ;;
        manifest|json_*) len=32768; limit="" ;;
        *) len=16384; limit="" ;;
    esac
    log=target/fuzz-$t.log
    mkdir -p target
    cargo +nightly fuzz run -s none -a -O "$t" -- -runs="$RUNS" $limit \
        -max_len=$len -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 > "$log" 2>&1
    rc=$?
    done_line=$(grep -E '^Done [0-9]+ runs' "$log" | tail -1)
    execs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}')
    crash=$(grep -Eo 'Test unit written to [^ ]+' "$log" | tail -1)
    echo "$t rc=$rc execs=${execs:-?} ${done_line:-} ${crash:-}"
done
