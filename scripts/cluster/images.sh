#!/usr/bin/env bash
# Builds the Dockerfile's `runtime-cpu` and `operator` targets with buildah on the locally bootstrapped base
# (base-images.sh) and leaves each as an oci-archive under the cache, keyed by the Dockerfile, the copied
# sources and the base image: an unchanged tree is not rebuilt. Prints the archives, one per line.
# Where the host's pip trusts a private CA bundle, it goes in as the build secret `pip-ca` (never a layer);
# where torch's CPU wheel lies in a local --find-links folder, that folder is mounted into the torch step.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$here/lib.sh"
[[ $(id -u) -eq 0 ]] || { echo "images.sh: run as root (buildah)" >&2; exit 1; }
mapfile -t base < <(bash "$here/base-images.sh")
base_key=$(basename "${base[0]}" .tar)

ctx_key=$(cd "$root" && { cat Dockerfile .dockerignore; git ls-files -s pyproject.toml README.md runtime operator;
  git diff HEAD -- pyproject.toml README.md runtime operator; } | sha256sum | cut -c1-12)

build_args=(--format docker --isolation chroot --network host --layers --build-arg "CPU_BASE_IMAGE=$BASE_IMAGE"
            --build-arg "PYTHON_IMAGE=$BASE_IMAGE" --build-arg "SKIFF_VERSION=$SKIFF_VERSION")
ca=$(python3 -m pip config get global.cert 2>/dev/null || true)
[[ -z "$ca" && -s /etc/ssl/certs/ca-certificates.crt ]] && ca=/etc/ssl/certs/ca-certificates.crt
[[ -n "$ca" ]] && build_args+=(--secret "id=pip-ca,src=$ca")
links=$(python3 -m pip config get global.find-links 2>/dev/null || true)
if [[ -n "$links" && -d "$links" ]] && compgen -G "$links/torch-*cpu*.whl" >/dev/null; then
  build_args+=(--volume "$links:/wheels:ro" --build-arg "TORCH_PIP_ARGS=--find-links /wheels")
fi

build() {  # TARGET IMAGE
  local tar
  tar=$(image_archive "$2" "$ctx_key-$base_key")
  if [[ ! -s "$tar" ]]; then
    local t0=$SECONDS
    log "building --target $1 -> $2 (log: $CLUSTER_CACHE/build-$1.log)"
    if ! buildah bud "${build_args[@]}" --target "$1" -t "$2" -f "$root/Dockerfile" "$root" \
         >"$CLUSTER_CACHE/build-$1.log" 2>&1; then
      tail -n 40 "$CLUSTER_CACHE/build-$1.log" >&2
      exit 1
    fi
    buildah push -q "$2" "oci-archive:$tar.tmp:$2"
    mv "$tar.tmp" "$tar"
    log "built $2 in $((SECONDS - t0)) s: $(buildah images --format '{{.Size}}' "$2" | head -n1)"
    # Older archives of this image, and the layers no image uses any more.
    prune_archives "$2" "$tar"
    buildah rmi --prune >/dev/null 2>&1 || true
  fi
  echo "$tar"
}
echo "${base[1]}"
build operator "$OPERATOR_IMAGE"
build runtime-cpu "$CPU_IMAGE"
