#!/usr/bin/env bash
# Installs what the e2e harness needs on a fresh Debian machine, then builds the control-plane
# binaries. Safe to rerun: a warm machine skips apt entirely and finds the binaries cached.
#   Debian packages  iproute2 iputils-ping util-linux prometheus ca-certificates dnsmasq-base qemu-utils
#                    e2fsprogs containernetworking-plugins debian-archive-keyring gcc make autoconf
#                    automake libtool pkg-config liblz4-dev uuid-dev
#                    (cold: ~1 min, warm: 0 s; util-linux brings setpriv, for the daemon run
#                    without CAP_NET_RAW; dnsmasq-base, the DHCP server of ch-standin's test; qemu-utils, the
#                    qcow2 disk the real cocoon imports; e2fsprogs, the mkfs.ext4 of the real cocoon's
#                    COW disk for an OCI image; containernetworking-plugins, the bridge and host-local
#                    plugins of the real cocoon's CNI network (/usr/lib/cni); the keyring, compilers,
#                    autotools, lz4 and uuid headers build mkfs.erofs from trixie's source package)
#   build-deps.sh    the k8s control plane, etcd, registry, metrics-server, the real cocoon CLI,
#                    cocoon-operator,
#                    mkfs.erofs (cold: ~20 min, warm: <1 s)
set -euo pipefail

log() { printf '[ci-setup %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# dpkg, not `command -v`: prometheus also needs its config and users from the package, and a
# stray binary on PATH would hide a missing install.
pkgs=(iproute2 iputils-ping util-linux prometheus ca-certificates dnsmasq-base qemu-utils e2fsprogs
  containernetworking-plugins debian-archive-keyring gcc make autoconf automake libtool pkg-config
  liblz4-dev uuid-dev)
missing=()
for pkg in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$pkg")
  fi
done

if ((${#missing[@]})); then
  SECONDS=0
  log "installing ${missing[*]} (usually ~1 minute: apt-get update once, then install)"
  export DEBIAN_FRONTEND=noninteractive
  sudo=()
  ((EUID == 0)) || sudo=(sudo)
  "${sudo[@]}" apt-get update -q
  # No recommends: prometheus recommends node-exporter and friends, which the harness never runs.
  "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
  log "packages installed in ${SECONDS}s"
else
  log "Debian packages already installed (${pkgs[*]})"
fi

# The package's service (when the machine runs an init that starts it) would hold :9090 and
# scrape on its own; the harness starts its own Prometheus on a free loopback port.
if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
  log "stopping the packaged prometheus service (the harness runs its own)"
  systemctl stop prometheus || true
fi

SECONDS=0
log "building control-plane binaries (cold: ~10 min on 2 cores; cached: <1 s)"
bash "$here/build-deps.sh"
log "build-deps finished in ${SECONDS}s"
