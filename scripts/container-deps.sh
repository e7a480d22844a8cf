#!/usr/bin/env bash
# Installs what the container test (tests/test_container.py) and `make images` need on Debian:
# podman (with runc) to build and run images without a daemon, debootstrap to make a base image when
# no container registry can be reached. As root it installs what is missing; as another user it says
# what to install and exits 1. Nothing is installed when everything is already there.
#   scripts/container-deps.sh            install what is missing (root)
#   scripts/container-deps.sh --check    exit 0 when everything is there, 1 (with the list) otherwise
set -euo pipefail

missing=()
for tool in podman:podman runc:runc debootstrap:debootstrap; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool#*:}")
done
# uidmap (newuidmap) is what podman needs to run as a user other than root.
if (( EUID != 0 )) && ! command -v newuidmap >/dev/null 2>&1; then
    missing+=(uidmap)
fi
if (( ${#missing[@]} == 0 )); then
    exit 0
fi
if [[ "${1:-}" == --check ]]; then
    echo "container-deps: missing: ${missing[*]}" >&2
    exit 1
fi
if (( EUID != 0 )); then
    echo "container-deps: missing ${missing[*]}; as root run: apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "container-deps: no apt-get here; install ${missing[*]} (podman, runc, debootstrap) by hand" >&2
    exit 1
fi
echo "container-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
