# Shared settings of the local test cluster scripts (sourced, not run).
# Caches (base images, built images, the kube binaries) live under ~/.cache, keyed by their inputs;
# a running cluster keeps all of its state under $SKIFF_CLUSTER_DIR.
CLUSTER_CACHE="${SKIFF_CLUSTER_CACHE:-$HOME/.cache/skiff-cluster}"
KUBE_BIN="${SKIFF_KUBE_CACHE:-$HOME/.cache/skiff-kube}/bin"
CLUSTER_DIR="${SKIFF_CLUSTER_DIR:-$CLUSTER_CACHE/run}"
IMAGE_DIR="$CLUSTER_CACHE/images"
DEBIAN_SUITE=bookworm
BASE_IMAGE=localhost/skiff-base:bookworm
PAUSE_IMAGE=localhost/pause:skiff-1
SKIFF_VERSION=$(awk -F'"' '/^version =/ {print $2; exit}' "$(dirname "${BASH_SOURCE[0]}")/../../pyproject.toml")
CPU_IMAGE="localhost/skiff:${SKIFF_VERSION}-cpu"
OPERATOR_IMAGE="localhost/skiff-operator:${SKIFF_VERSION}"

mkdir -p "$CLUSTER_CACHE/containers" "$IMAGE_DIR"
# buildah's storage and configuration are private to the cache (the system's are left alone).
export CONTAINERS_STORAGE_CONF="$CLUSTER_CACHE/storage.conf"
cat >"$CONTAINERS_STORAGE_CONF" <<CONF
[storage]
driver = "overlay"
graphroot = "$CLUSTER_CACHE/containers/storage"
runroot = "$CLUSTER_CACHE/containers/run"
CONF

log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

# The cached oci-archive of IMAGE built from inputs KEY.
image_archive() { echo "$IMAGE_DIR/$(echo "$1" | tr '/:' '__')-$2.tar"; }

# Deletes IMAGE's archives other than KEEP (those of older inputs).
prune_archives() {  # IMAGE KEEP
  find "$IMAGE_DIR" -name "$(echo "$1" | tr '/:' '__')-*.tar" ! -name "$(basename "$2")" -delete
}
