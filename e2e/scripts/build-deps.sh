#!/usr/bin/env bash
# Builds the real components the e2e testbed runs, from their Go modules, into a cache
# outside the checkout (CI clones afresh each run, so an in-tree cache would always be cold).
#   kube-apiserver + kubectl  k8s.io/kubernetes   (cold: ~9-10 min on 2 cores)
#   kube-scheduler + kube-controller-manager, same module (cold, after the apiserver: ~3.5 min)
#   etcd                      go.etcd.io/etcd/server/v3 (cold: ~2 min)
#   registry                  distribution v3 cmd/registry (cold: ~2 min)
#   metrics-server            sigs.k8s.io/metrics-server (cold: ~5 min; for `kubectl top`)
#   cocoon (`build-deps.sh cocoon`) the real cocoon CLI from shared/vendor (cold: 1-4 min)
#   cocoon-operator           the real operator from shared/vendor, with cocoon-common beside it (cold: ~2 min)
#   mkfs.erofs                erofs-utils 1.8.6 from Debian trixie's source package (cold: ~25 s)
# A second run finds the binaries and returns in well under a second.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.6.5}
REGISTRY_VERSION=${REGISTRY_VERSION:-v3.1.2}
METRICS_SERVER_VERSION=${METRICS_SERVER_VERSION:-v0.9.0}
CACHE=${VK_COCOON_CACHE:-$HOME/.cache/vk-cocoon}
BIN="$CACHE/bin"
mkdir -p "$BIN" "$CACHE/src"

log() { printf '[build-deps %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# go build -v prints one line per compiled package; show a count instead of a wall of text.
progress() {
  local what=$1 n=0 line
  while IFS= read -r line; do
    n=$((n + 1))
    if (( n % 100 == 0 )); then log "$what: $n packages compiled so far"; fi
    # Package paths such as k8s.io/apimachinery/pkg/util/errors are progress, not failures:
    # only compiler diagnostics (file.go:line:col: ...) and the go tool's own complaints show.
    case "$line" in
      *.go:*) printf '%s\n' "$line" >&2 ;;
      "go: downloading "*) ;;
      "go: "*) printf '%s\n' "$line" >&2 ;;
    esac
  done
  log "$what: $n packages compiled"
}

need_go() {
  command -v go >/dev/null || { echo "go not found: install Go 1.26 (see README, Testbed)" >&2; exit 1; }
}

# The k8s.io/kubernetes binaries the testbed runs, all from one module at one version.
K8S_CMDS=(kube-apiserver kubectl kube-scheduler kube-controller-manager)

build_k8s() {
  local missing=() cmd
  for cmd in "${K8S_CMDS[@]}"; do
    [[ -x $BIN/$cmd-$K8S_VERSION ]] || missing+=("$cmd")
  done
  if ((${#missing[@]} == 0)); then log "${K8S_CMDS[*]} $K8S_VERSION cached"; return; fi
  need_go
  local dir="$CACHE/src/k8s-$K8S_VERSION" minor=${K8S_VERSION#v1.}
  minor=${minor%%.*}
  mkdir -p "$dir"
  log "${missing[*]} $K8S_VERSION: cold build: the apiserver and kubectl usually 9-10 minutes on 2 cores, the scheduler and controller-manager ~4 more"
  local gomod
  gomod=$(cd "$dir" && GOFLAGS= go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  [[ -f $gomod ]] || { echo "could not download k8s.io/kubernetes@$K8S_VERSION (is the Go module proxy reachable?)" >&2; exit 1; }
  {
    echo "module vkcocoon.local/k8sbuild"
    echo
    echo "go 1.26"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    # Every staging replace in kubernetes' own go.mod becomes a released-module replace.
    grep -oE 'k8s\.io/[a-z0-9-]+ => \./staging/src/k8s\.io/[a-z0-9-]+' "$gomod" |
      awk -v v="v0.$minor.${K8S_VERSION##*.}" '{print "replace " $1 " => " $1 " " v}'
  } >"$dir/go.mod"
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for cmd in "${K8S_CMDS[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$cmd"; done
    printf ')\n'
  } >"$dir/tools.go"
  log "resolving modules (go mod tidy, ~20 s)"
  (cd "$dir" && go mod tidy >/dev/null)
  local ld="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
  local out
  # In K8S_CMDS order: the apiserver compiles most of what the others share, so each later
  # binary mostly links packages already in Go's build cache.
  for cmd in "${missing[@]}"; do
    out="$BIN/$cmd-$K8S_VERSION"
    SECONDS=0
    log "compiling $cmd"
    (cd "$dir" && go build -v -ldflags "$ld" -o "$out.tmp" "k8s.io/kubernetes/cmd/$cmd" 2>&1) | progress "$cmd"
    mv "$out.tmp" "$out"
    log "$cmd built in ${SECONDS}s"
  done
}

# Builds one main package from a wrapper module: etcd's and distribution's own go.mod files carry
# replace directives, which `go install pkg@version` refuses.
build_wrapped() {
  local name=$1 module=$2 version=$3 pkg=$4 ldflags=${5:-} out="$BIN/$1-$3"
  local dir="$CACHE/src/$name-$version"
  mkdir -p "$dir"
  printf 'module vkcocoon.local/%sbuild\n\ngo 1.26\n\nrequire %s %s\n' "$name" "$module" "$version" >"$dir/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$pkg" >"$dir/tools.go"
  (cd "$dir" && go mod tidy >/dev/null)
  (cd "$dir" && go build -v -ldflags "$ldflags" -o "$out.tmp" "$pkg" 2>&1) | progress "$name"
  mv "$out.tmp" "$out"
}

build_etcd() {
  if [[ -x $BIN/etcd-$ETCD_VERSION ]]; then log "etcd $ETCD_VERSION cached"; return; fi
  need_go
  log "etcd $ETCD_VERSION: cold build, usually ~2 minutes"
  build_wrapped etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" go.etcd.io/etcd/server/v3
}

build_registry() {
  if [[ -x $BIN/registry-$REGISTRY_VERSION ]]; then log "registry $REGISTRY_VERSION cached"; return; fi
  need_go
  log "distribution registry $REGISTRY_VERSION: cold build, usually ~2 minutes"
  build_wrapped registry github.com/distribution/distribution/v3 "$REGISTRY_VERSION" \
    github.com/distribution/distribution/v3/cmd/registry
}

build_metrics_server() {
  if [[ -x $BIN/metrics-server-$METRICS_SERVER_VERSION ]]; then log "metrics-server $METRICS_SERVER_VERSION cached"; return; fi
  need_go
  log "metrics-server $METRICS_SERVER_VERSION: cold build, usually ~5 minutes on 2 cores"
  # Its version is client-go's build stamp, as its own Makefile sets it.
  build_wrapped metrics-server sigs.k8s.io/metrics-server "$METRICS_SERVER_VERSION" \
    sigs.k8s.io/metrics-server/cmd/metrics-server \
    "-X k8s.io/client-go/pkg/version.gitVersion=$METRICS_SERVER_VERSION"
}

# The real cocoon CLI, from the source kept beside the repository (shared/vendor): the Go
# module proxy does not serve cocoonstack modules; every other dependency comes from it.
COCOON_COMMIT=${COCOON_COMMIT:-34c6c4a8ebdd}
build_cocoon() {
  local out="$BIN/cocoon-$COCOON_COMMIT"
  if [[ -x $out ]]; then log "cocoon $COCOON_COMMIT cached"; return; fi
  need_go
  local here tarball dir="$CACHE/src/cocoon-$COCOON_COMMIT"
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  tarball="$here/../../../shared/vendor/cocoon-$COCOON_COMMIT.tar.gz"
  [[ -f $tarball ]] || { echo "$tarball is missing: the real cocoon builds from shared/vendor beside the repository" >&2; exit 1; }
  log "cocoon $COCOON_COMMIT: cold build from $tarball, usually 1-4 minutes on 2 cores"
  rm -rf "$dir" && mkdir -p "$dir"
  tar -xzf "$tarball" -C "$dir" --strip-components=1
  (cd "$dir" && CGO_ENABLED=0 go build -v \
    -ldflags "-X github.com/cocoonstack/cocoon/version.REVISION=$COCOON_COMMIT" \
    -o "$out.tmp" . 2>&1) | progress cocoon
  mv "$out.tmp" "$out"
  ln -sf "cocoon-$COCOON_COMMIT" "$BIN/cocoon-real"
}

# The real cocoon-operator (CocoonSet, CocoonHibernation), from shared/vendor like cocoon. Its
# cocoon-common dependency is not on the module proxy either, so both tarballs unpack side by
# side and a replace points the operator at the local copy.
OPERATOR_COMMIT=${OPERATOR_COMMIT:-6151b055cbde}
COMMON_COMMIT=${COMMON_COMMIT:-8de9092a9c6f}
# The testbed applies the operator's CRDs and its ClusterRole from the same source, so they are
# kept beside the binary: share/cocoon-operator/{crd,rbac}.
install_operator_manifests() {
  local tarball=$1 share="$CACHE/share/cocoon-operator-$OPERATOR_COMMIT"
  if [[ ! -f $share/rbac/role.yaml ]]; then
    rm -rf "$share.tmp" && mkdir -p "$share.tmp/crd" "$share.tmp/rbac"
    tar -xzf "$tarball" -C "$share.tmp/crd" --strip-components=4 cocoon-operator/config/crd/bases
    tar -xzf "$tarball" -C "$share.tmp/rbac" --strip-components=3 cocoon-operator/config/rbac/role.yaml
    rm -rf "$share" && mv "$share.tmp" "$share"
  fi
  ln -sfn "cocoon-operator-$OPERATOR_COMMIT" "$CACHE/share/cocoon-operator"
}

build_operator() {
  local out="$BIN/cocoon-operator-$OPERATOR_COMMIT"
  local here vendor dir="$CACHE/src/cocoon-operator-$OPERATOR_COMMIT" t
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  vendor="$here/../../../shared/vendor"
  for t in "cocoon-operator-$OPERATOR_COMMIT" "cocoon-common-$COMMON_COMMIT"; do
    [[ -f $vendor/$t.tar.gz ]] || { echo "$vendor/$t.tar.gz is missing: the operator builds from shared/vendor beside the repository" >&2; exit 1; }
  done
  mkdir -p "$CACHE/share"
  install_operator_manifests "$vendor/cocoon-operator-$OPERATOR_COMMIT.tar.gz"
  if [[ -x $out ]]; then log "cocoon-operator $OPERATOR_COMMIT cached"; ln -sf "cocoon-operator-$OPERATOR_COMMIT" "$BIN/cocoon-operator"; return; fi
  need_go
  log "cocoon-operator $OPERATOR_COMMIT (cocoon-common $COMMON_COMMIT): cold build from $vendor, usually ~2 minutes on 2 cores"
  SECONDS=0
  rm -rf "$dir" && mkdir -p "$dir/cocoon-operator" "$dir/cocoon-common"
  tar -xzf "$vendor/cocoon-operator-$OPERATOR_COMMIT.tar.gz" -C "$dir/cocoon-operator" --strip-components=1
  tar -xzf "$vendor/cocoon-common-$COMMON_COMMIT.tar.gz" -C "$dir/cocoon-common" --strip-components=1
  (cd "$dir/cocoon-operator" && go mod edit -replace github.com/cocoonstack/cocoon-common=../cocoon-common)
  log "cocoon-operator: downloading modules"
  (cd "$dir/cocoon-operator" && go mod download 2>&1) | progress cocoon-operator-modules
  (cd "$dir/cocoon-operator" && CGO_ENABLED=0 go build -v \
    -ldflags "-X github.com/cocoonstack/cocoon-operator/version.REVISION=$OPERATOR_COMMIT" \
    -o "$out.tmp" . 2>&1) | progress cocoon-operator
  mv "$out.tmp" "$out"
  ln -sf "cocoon-operator-$OPERATOR_COMMIT" "$BIN/cocoon-operator"
  log "cocoon-operator $OPERATOR_COMMIT built in ${SECONDS}s"
}

# mkfs.erofs with `--tar=f`, which the real cocoon's `image pull` of an OCI image runs for every
# layer: bookworm's erofs-utils 1.5 predates it. Built from trixie's Debian source package (the
# upstream tarball it names) through a private apt configuration under the cache, so the
# machine's own sources and package state are never touched. Only what mkfs needs: lz4 (cocoon
# asks for lz4hc) and libuuid; no fuse, selinux, lzma or zlib.
EROFS_VERSION=${EROFS_VERSION:-1.8.6}
EROFS_DEBIAN_VERSION=${EROFS_DEBIAN_VERSION:-$EROFS_VERSION-1}
build_erofs() {
  local out="$BIN/mkfs.erofs-$EROFS_VERSION"
  if [[ -x $out ]]; then log "mkfs.erofs $EROFS_VERSION cached"; ln -sf "mkfs.erofs-$EROFS_VERSION" "$BIN/mkfs.erofs"; return; fi
  local apt="$CACHE/apt-trixie-src" dir="$CACHE/src/erofs-utils-$EROFS_VERSION"
  log "mkfs.erofs $EROFS_VERSION: cold build from Debian trixie's source package, usually ~25 s"
  SECONDS=0
  mkdir -p "$apt/etc/sources.list.d" "$apt/etc/preferences.d" "$apt/state/lists/partial" \
    "$apt/cache/archives/partial"
  printf 'deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main\n' \
    >"$apt/etc/sources.list"
  local opts=(
    -o "Dir::Etc::SourceList=$apt/etc/sources.list"
    -o "Dir::Etc::SourceParts=$apt/etc/sources.list.d"
    -o "Dir::Etc::PreferencesParts=$apt/etc/preferences.d"
    -o "Dir::State=$apt/state"
    -o "Dir::State::status=/var/lib/dpkg/status"
    -o "Dir::Cache=$apt/cache"
    # The cache may belong to a user _apt cannot write for.
    -o "APT::Sandbox::User=$(id -un)"
  )
  log "mkfs.erofs: apt-get update of trixie's source index (private configuration in $apt)"
  apt-get -q "${opts[@]}" update >"$apt/update.log" 2>&1 ||
    { cat "$apt/update.log" >&2; echo "apt-get update of trixie's sources failed" >&2; exit 1; }
  rm -rf "$dir" && mkdir -p "$dir/pkg" "$dir/src"
  (cd "$dir/pkg" && apt-get -q "${opts[@]}" source --download-only "erofs-utils=$EROFS_DEBIAN_VERSION" >"$dir/source.log" 2>&1) ||
    { cat "$dir/source.log" >&2; echo "apt-get source erofs-utils=$EROFS_DEBIAN_VERSION failed" >&2; exit 1; }
  tar -xzf "$dir/pkg/erofs-utils_$EROFS_VERSION.orig.tar.gz" -C "$dir/src" --strip-components=1
  log "mkfs.erofs: autogen, configure, make"
  (
    cd "$dir/src"
    ./autogen.sh
    ./configure --disable-lzma --without-zlib --disable-fuse --without-selinux \
      --disable-shared --enable-static
    make -j2
  ) >"$dir/build.log" 2>&1 || { tail -30 "$dir/build.log" >&2; echo "building erofs-utils failed (log: $dir/build.log)" >&2; exit 1; }
  "$dir/src/mkfs/mkfs.erofs" --help 2>&1 | grep -q -- '--tar=' ||
    { echo "the built mkfs.erofs has no --tar" >&2; exit 1; }
  cp "$dir/src/mkfs/mkfs.erofs" "$out.tmp"
  mv "$out.tmp" "$out"
  ln -sf "mkfs.erofs-$EROFS_VERSION" "$BIN/mkfs.erofs"
  log "mkfs.erofs $EROFS_VERSION built in ${SECONDS}s"
}

what=${1:-all}
case $what in
  k8s) build_k8s ;;
  etcd) build_etcd ;;
  registry) build_registry ;;
  metrics-server) build_metrics_server ;;
  cocoon) build_cocoon ;;
  cocoon-operator) build_operator ;;
  erofs) build_erofs ;;
  all) build_etcd; build_registry; build_metrics_server; build_k8s; build_cocoon; build_operator; build_erofs ;;
  *) echo "usage: $0 [all|k8s|etcd|registry|metrics-server|cocoon|cocoon-operator|erofs]" >&2; exit 2 ;;
esac
for b in kube-apiserver-$K8S_VERSION kubectl-$K8S_VERSION kube-scheduler-$K8S_VERSION \
  kube-controller-manager-$K8S_VERSION etcd-$ETCD_VERSION registry-$REGISTRY_VERSION \
  metrics-server-$METRICS_SERVER_VERSION; do
  [[ -x $BIN/$b ]] && ln -sf "$b" "$BIN/${b%-v*}"
done
log "done; binaries in $BIN"
