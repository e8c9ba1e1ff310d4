# Sourced by the connection benchmarks (watch-connections.sh, watch-ab.sh):
# a throw-away cluster of the newest system PostgreSQL for
# MAX_CONNECTIONS clients, initialised for pgbench at scale 10, stopped and
# removed on exit with whatever was added to `pids`. Sets pgbin, dir,
# port, dsn, as_pg and pids.
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
as_pg "$pgbin/pg_ctl" -w -D "$dir/data" -l "$dir/log" \
  -o "-k $dir -p $port -c listen_addresses='' -c max_connections=${MAX_CONNECTIONS:-1100}" start >/dev/null
pgbench -h "$dir" -p "$port" -U postgres -i -q -s 10 postgres >/dev/null 2>&1
dsn="host=$dir port=$port user=postgres dbname=postgres"
