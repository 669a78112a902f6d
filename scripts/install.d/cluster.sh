#!/usr/bin/env bash
# The local single-node cluster's system packages (scripts/cluster/): containerd, runc, the CNI plugins,
# buildah and debootstrap for the images, iptables and conntrack for kube-proxy. Root only (apt); the
# binaries, images and cluster state themselves are built on first use and cached under ~/.cache.
# SKIFF_E2E_SKIP=1 skips this (the e2e tests then skip with a message saying so).
set -euo pipefail
[[ "${SKIFF_E2E_SKIP:-}" == "1" ]] && { echo "install.d/cluster.sh: skipped (SKIFF_E2E_SKIP=1)"; exit 0; }
[[ $(id -u) -eq 0 ]] || { echo "install.d/cluster.sh: not root, the e2e cluster cannot run here"; exit 0; }
pkgs=(containerd runc containernetworking-plugins buildah debootstrap iptables conntrack)
need=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
if ((${#need[@]})); then
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
