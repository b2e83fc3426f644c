#!/usr/bin/env bash
# The shipped binary: vk-cocoon linked statically against musl (no libc on the host or in
# the image is needed), stripped, with its debug information kept beside it and linked by
# .gnu_debuglink, so a core or a perf profile of the shipped binary still resolves.
#   musl-tools   Debian's musl-gcc, for the C parts of ring and zstd (installed when missing)
#   rustup       the x86_64-unknown-linux-musl standard library (added when missing)
#   cargo        release build for that target (cold: ~8 min on 2 cores; warm: seconds)
# Output: $TARGET_DIR/dist/vk-cocoon and vk-cocoon.debug.
set -euo pipefail

log() { printf '[dist %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target_dir=${CARGO_TARGET_DIR:-$top/target}
triple=x86_64-unknown-linux-musl
out=$target_dir/dist

if ! command -v musl-gcc >/dev/null; then
  if ((EUID == 0)); then
    log "installing Debian's musl-tools (musl-gcc, for ring and zstd's C code; ~20 s)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends musl-tools
  else
    log "musl-gcc is missing: run  sudo apt-get install musl-tools"
    exit 1
  fi
fi
if ! rustup target list --installed | grep -qx "$triple"; then
  log "adding the $triple standard library (rustup, ~30 s)"
  rustup target add "$triple"
fi

SECONDS=0
log "cargo build --release --target $triple (cold: ~8 min on 2 cores, warm: seconds)"
cargo build -j"${JOBS:-2}" --release --target "$triple" -p vk-cocoon --bin vk-cocoon
bin=$target_dir/$triple/release/vk-cocoon
log "built in ${SECONDS}s"

mkdir -p "$out"
objcopy --only-keep-debug --compress-debug-sections=zlib "$bin" "$out/vk-cocoon.debug"
objcopy --strip-all --add-gnu-debuglink="$out/vk-cocoon.debug" "$bin" "$out/vk-cocoon.tmp"
mv "$out/vk-cocoon.tmp" "$out/vk-cocoon"
"$out/vk-cocoon" version >/dev/null
log "$out/vk-cocoon: $(du -h "$out/vk-cocoon" | cut -f1) stripped, debug information in vk-cocoon.debug ($(du -h "$out/vk-cocoon.debug" | cut -f1))"
