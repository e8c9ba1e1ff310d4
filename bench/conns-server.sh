# Sourced by the connection benchmarks (watch-connections.sh, watch-ab.sh):
# a throw-away cluster of the newest system PostgreSQL for
# MAX_CONNECTIONS clients, initialised for pgbench at scale 10, stopped and
# removed on exit with whatever was added to `pids`. Sets pgbin, dir,
# port, dsn, as_pg and pids, and defines start_load.
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
dir=$(mktemp -d /tmp/pgbelow-bench-conns-XXXXXX)
chown postgres: "$dir"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
as_pg() { runuser -u postgres -- "$@"; }
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  as_pg "$pgbin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
# pgbench's 1,000 clients need more than a soft limit of 1,024; the hard
# limit stays, so that pgbelow raises its own as it would anywhere (its
# descriptor budget follows the limit).
ulimit -Sn "$(ulimit -Hn)"
as_pg "$pgbin/initdb" -A trust -U postgres -D "$dir/data" >/dev/null
# Listening on TCP as a user's server does (LISTEN_ADDRESSES= : the Unix
# socket only, as every run before 2026-12-03): with a TCP port the pgstat
# collector reads the clients' TCP sockets once a second, a dump whose
# kernel walk costs the same whatever the clients connect through.
as_pg "$pgbin/pg_ctl" -w -D "$dir/data" -l "$dir/log" \
  -o "-k $dir -p $port -c listen_addresses='${LISTEN_ADDRESSES-localhost}' -c max_connections=${MAX_CONNECTIONS:-1100}" start >/dev/null
pgbench -h "$dir" -p "$port" -U postgres -i -q -s 10 postgres >/dev/null 2>&1
dsn="host=$dir port=$port user=postgres dbname=postgres"

# start_load SECONDS IDLE: 10 active connections (pgbench select-only at
# RATE tps) and IDLE more, each selecting once every 30 s (an
# application's pool: pgbench -R cannot hold them, a client whose next
# scheduled transaction falls after -T ends at once), for SECONDS; returns
# once every idle connection is open. Adds both pgbench to `pids`.
start_load() {
  local secs=$1 idle=$2 n
  pgbench -h "$dir" -p "$port" -U postgres -S -M prepared -c 10 -j 2 -R "${RATE:-500}" -T "$secs" postgres >"$dir/active.out" 2>&1 &
  pids+=($!)
  [ "$idle" -gt 0 ] || return 0
  # SPREAD=1: each client sleeps 15-45 s at random, so the pool's
  # wake-ups are spread as an application's are; by default all sleep 30 s
  # and wake together (a run-queue jump every 30 s on 2 CPUs).
  if [ "${SPREAD:-0}" = 1 ]; then
    printf '\\set d random(15, 45)\n\\sleep :d s\nselect 1;\n' >"$dir/idle.sql"
  else
    printf '\\sleep 30 s\nselect 1;\n' >"$dir/idle.sql"
  fi
  pgbench -h "$dir" -p "$port" -U postgres -n -f "$dir/idle.sql" -c "$idle" -j 10 -T "$secs" postgres >"$dir/idle.out" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 60); do
    n=$(psql -h "$dir" -p "$port" -U postgres -Atc "select count(*) from pg_stat_activity where backend_type = 'client backend'" postgres 2>/dev/null || echo 0)
    [ "$n" -ge "$idle" ] && break
    sleep 1
  done
}
