#!/usr/bin/env bash
# Fetches Debian's cloud kernel (linux-image-cloud-amd64: cgroup v2 with the
# cpu, io and memory controllers, BTF, PSI) into DIR once, without
# installing it on this host: `apt-get download` and `dpkg-deb -x`.
# Prints the path of its vmlinuz.
set -euo pipefail
dir=$1
mkdir -p "$dir"
pkg=$(apt-cache depends linux-image-cloud-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9].*-cloud-amd64\)$/\1/p' | head -1)
[ -n "$pkg" ] || { echo "tests/vm/kernel.sh: no linux-image-*-cloud-amd64 in the apt lists (apt-get update)" >&2; exit 1; }
ver=${pkg#linux-image-}
if [ ! -s "$dir/vmlinuz-$ver" ]; then
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  (cd "$scratch" && apt-get download -q "$pkg" >/dev/null 2>&1)
  dpkg-deb --fsys-tarfile "$scratch"/"$pkg"_*.deb | tar -x -C "$scratch" "./boot/vmlinuz-$ver"
  mv "$scratch/boot/vmlinuz-$ver" "$dir/vmlinuz-$ver.tmp"
  mv "$dir/vmlinuz-$ver.tmp" "$dir/vmlinuz-$ver"
fi
echo "$dir/vmlinuz-$ver"
