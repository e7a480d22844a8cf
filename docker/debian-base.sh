#!/usr/bin/env bash
# Makes a Debian base image without any container registry: debootstrap --variant=minbase, trimmed
# (no apt lists, docs, man pages or locales, and dpkg told to keep it so), imported with podman or
# docker. The root filesystem's tarball is kept in the cache directory: a second run only imports it.
#   docker/debian-base.sh ENGINE TAG [SUITE]      e.g. docker/debian-base.sh podman localhost/fleetlog-base:bookworm
# Settings: FLEETLOG_IMAGE_CACHE (default /var/cache/fleetlog-test as root, else ~/.cache/fleetlog-test),
#           DEBIAN_MIRROR (default http://deb.debian.org/debian). Needs root (debootstrap) on a cold cache.
set -euo pipefail

engine="${1:?engine: podman or docker}"
tag="${2:?image tag}"
suite="${3:-bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
if (( EUID == 0 )); then default_cache=/var/cache/fleetlog-test; else default_cache="$HOME/.cache/fleetlog-test"; fi
cache="${FLEETLOG_IMAGE_CACHE:-$default_cache}"
tarball="$cache/debian-$suite-minbase.tar"

if [[ ! -s "$tarball" ]]; then
    (( EUID == 0 )) || { echo "debian-base: debootstrap needs root (or put a rootfs tarball at $tarball)" >&2; exit 1; }
    mkdir -p "$cache"
    rootfs="$(mktemp -d "$cache/rootfs.XXXXXX")"
    trap 'rm -rf "$rootfs"' EXIT
    echo "debian-base: debootstrap --variant=minbase $suite from $mirror (a minute or two)"
    debootstrap --variant=minbase "$suite" "$rootfs" "$mirror" > "$cache/debootstrap.log" 2>&1 \
        || { tail -20 "$cache/debootstrap.log" >&2; exit 1; }
    rm -rf "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
        "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/* \
        "$rootfs"/var/log/*.log "$rootfs"/var/log/apt/*
    cat > "$rootfs/etc/dpkg/dpkg.cfg.d/01-fleetlog-slim" <<'CFG'
path-exclude /usr/share/doc/*
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
CFG
    printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' > "$rootfs/etc/apt/apt.conf.d/01-fleetlog-slim"
    tar -C "$rootfs" --numeric-owner -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
fi
"$engine" import --change 'CMD ["/bin/bash"]' "$tarball" "$tag" >/dev/null
echo "debian-base: $tag from $tarball"
