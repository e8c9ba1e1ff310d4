#!/usr/bin/env bash
# Builds the guest's whole root filesystem as an uncompressed initramfs OUT:
# busybox (static), this host's PostgreSQL 15 (server, initdb, pg_ctl,
# pgbench, psql) with its share files and the time zones, the pgbelow binary
# PGBELOW (debug info stripped), every shared library they load, accounts
# for root and postgres, and tests/vm/init as /init, which runs the test's
# /test.sh as root.
set -euo pipefail
out=$1
pgbelow=$2
here=$(cd "$(dirname "$0")" && pwd)
pg=/usr/lib/postgresql/15
stage=$(mktemp -d)
chmod 755 "$stage"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,usr/bin,etc,proc,sys,dev,tmp,run,root,var/lib/postgresql,lib64}
cp /usr/bin/busybox "$stage/bin/busybox"
mkdir -p "$stage$pg" "$stage/usr/share/postgresql" "$stage/usr/share"
cp -a "$pg/bin" "$pg/lib" "$stage$pg/"
# No JIT: llvmjit alone would bring 150 MB of LLVM (the server then runs
# with jit unavailable, as it does without the package).
rm -rf "$stage$pg/lib/llvmjit"* "$stage$pg/lib/bitcode"
cp -a /usr/share/postgresql/15 "$stage/usr/share/postgresql/"
cp -a /usr/share/zoneinfo "$stage/usr/share/"
objcopy --strip-debug "$pgbelow" "$stage/usr/bin/pgbelow"
# The libraries every ELF file here loads, at the paths the loader finds them.
find "$stage" -type f -perm -u+x -o -type f -name '*.so*' | while read -r f; do
  { ldd "$f" 2>/dev/null || true; } | awk '/=> \//{print $3} /^\t\/lib/{print $1}'
done | sort -u | while read -r lib; do
  mkdir -p "$stage$(dirname "$lib")"
  cp -L "$lib" "$stage$lib"
done
printf 'root:x:0:0:root:/root:/bin/sh\npostgres:x:100:100:PostgreSQL:/var/lib/postgresql:/bin/sh\n' > "$stage/etc/passwd"
printf 'root:x:0:\npostgres:x:100:\n' > "$stage/etc/group"
printf '127.0.0.1 localhost vm\n' > "$stage/etc/hosts"
printf 'passwd: files\ngroup: files\nhosts: files\n' > "$stage/etc/nsswitch.conf"
install -m 755 "$here/init" "$stage/init"
(cd "$stage" && find . | cpio -o -H newc --quiet) > "$out.tmp"
mv "$out.tmp" "$out"
