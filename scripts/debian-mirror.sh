#!/usr/bin/env bash
# Prints the Debian mirror this system's apt sources use (deb822 .sources first, then sources.list), so that
# the kube build (install.d/kube.sh) and the local base image (cluster/base-images.sh) fetch from the same one.
uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
[[ -z "$uri" ]] && uri=$(awk '$1 == "deb" && $2 !~ /^\[/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
echo "${uri:-http://deb.debian.org/debian}"
