#!/bin/sh
# Installs libevb, the C ABI of evb's plug-in API (docs/plugin.md), under a prefix:
#   PREFIX/lib/libevb.so.VERSION, its SONAME's link libevb.so.0.MINOR (before 1.0) and
#   libevb.so, PREFIX/include/evb.h, PREFIX/lib/pkgconfig/evb.pc
#
#   scripts/install-libevb.sh [PREFIX]          # default /usr/local; builds it (release)
#   EVB_LIB=path/to/libevb.so scripts/install-libevb.sh PREFIX   # installs that build
#
# Then: cc app.c $(PKG_CONFIG_PATH=PREFIX/lib/pkgconfig pkg-config --cflags --libs evb)
set -eu
prefix=${1:-/usr/local}
root=$(cd "$(dirname "$0")/.." && pwd)
lib=${EVB_LIB:-}
if [ -z "$lib" ]; then
    cargo build --release -p evb-capi --manifest-path "$root/Cargo.toml"
    lib=${CARGO_TARGET_DIR:-$root/target}/release/libevb.so
fi
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)
major=${version%%.*}
minor=$(echo "$version" | cut -d. -f2)
if [ "$major" = 0 ]; then soname=libevb.so.0.$minor; else soname=libevb.so.$major; fi
install -d "$prefix/lib/pkgconfig" "$prefix/include"
install -m 0755 "$lib" "$prefix/lib/libevb.so.$version"
ln -sf "libevb.so.$version" "$prefix/lib/$soname"
ln -sf "$soname" "$prefix/lib/libevb.so"
install -m 0644 "$root/crates/capi/include/evb.h" "$prefix/include/evb.h"
cat > "$prefix/lib/pkgconfig/evb.pc" <<EOF
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: evb
Description: evb plug-in API: feed an RU, take a BU's built events
Version: $version
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -levb
Cflags: -I\${includedir}
EOF
echo "installed libevb $version under $prefix"
