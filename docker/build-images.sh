#!/usr/bin/env bash
# Builds fleetlog-ingest and fleetlog-agent with podman or docker: `make images` and the container
# test run this. Without a container registry the bases come from debootstrap (docker/debian-base.sh).
#   docker/build-images.sh
# Settings (environment):
#   CONTAINER_ENGINE        podman or docker (default: podman when installed, else docker)
#   FLEETLOG_IMAGE_VERSION  baked into both images (label, env; the agent sends it in 'registered');
#                           default: pyproject's version + the git commit (+dirty)
#   FLEETLOG_IMAGE_BASE     auto (default): the Dockerfiles' bases when the registry answers, else a
#                           local Debian base; local: always the Debian base; registry: never it;
#                           or an image name used as the base of both
#   FLEETLOG_IMAGE_TAG      tag of both images (default latest)
#   FLEETLOG_IMAGES         which images to build (default "ingest agent")
#   FLEETLOG_INGEST_EXTRA   pyproject's extra in the ingest image: server (default) or lake, which
#                           adds what `fleetlog serve --lake` needs (about 90 MB; docs/scale-out.md)
#   FLEETLOG_CA_BUNDLE      CA bundle pip uses inside the build, passed as a build secret
#                           (default /etc/ssl/certs/ca-certificates.crt when it exists)
set -euo pipefail
cd "$(dirname "$0")/.."

engine="${CONTAINER_ENGINE:-}"
if [[ -z "$engine" ]]; then
    if command -v podman >/dev/null 2>&1; then engine=podman; elif command -v docker >/dev/null 2>&1; then engine=docker; else
        echo "build-images: neither podman nor docker is installed (scripts/container-deps.sh installs podman)" >&2
        exit 1
    fi
fi
if [[ "$engine" == podman && -z "${CONTAINERS_CONF:-}" ]] && command -v runc >/dev/null 2>&1; then
    export CONTAINERS_CONF="$PWD/docker/podman-containers.conf"
fi
version="${FLEETLOG_IMAGE_VERSION:-}"
if [[ -z "$version" ]]; then
    version="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)"
    commit="$(git rev-parse --short HEAD 2>/dev/null || true)"
    if [[ -n "$commit" ]]; then
        version="$version+g$commit"
        git diff --quiet HEAD 2>/dev/null || version="$version.dirty"
    fi
fi
tag="${FLEETLOG_IMAGE_TAG:-latest}"
local_base=localhost/fleetlog-base:bookworm

registry_reachable() {  # the Docker Hub registry answers (401 is an answer)
    python3 - <<'PY' 2>/dev/null
import sys, urllib.error, urllib.request
try:
    urllib.request.urlopen("https://registry-1.docker.io/v2/", timeout=5)
except urllib.error.HTTPError:
    pass
except Exception:
    sys.exit(1)
PY
}

base_args=()
choice="${FLEETLOG_IMAGE_BASE:-auto}"
if [[ "$choice" == auto ]]; then
    if registry_reachable; then choice=registry; else choice=local; fi
fi
case "$choice" in
    registry) ;;
    local)
        "$engine" image inspect "$local_base" >/dev/null 2>&1 || docker/debian-base.sh "$engine" "$local_base"
        base_args=(--build-arg "BASE=$local_base") ;;
    *) base_args=(--build-arg "BASE=$choice") ;;
esac

secret_args=()
ca="${FLEETLOG_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
[[ -s "$ca" ]] && secret_args=(--secret "id=ca,src=$ca")
format_args=()
[[ "$engine" == podman ]] && format_args=(--format docker)  # keeps HEALTHCHECK
if [[ "$engine" == docker ]]; then export DOCKER_BUILDKIT=1; fi  # RUN --mount needs BuildKit

base="${base_args[1]:-as in the Dockerfile}"
extra="${FLEETLOG_INGEST_EXTRA:-server}"
case "$extra" in server|lake) ;; *) echo "build-images: FLEETLOG_INGEST_EXTRA: expected server or lake, got '$extra'" >&2; exit 2 ;; esac
for image in ${FLEETLOG_IMAGES:-ingest agent}; do
    echo "build-images: fleetlog-$image:$tag (version $version, base ${base#BASE=})"
    # The version as a build argument and, for podman, again as --label/--env: buildah 1.28 reuses
    # cached layers whose build argument changed, so the Dockerfile's LABEL and ENV could be stale.
    version_args=(--build-arg "FLEETLOG_IMAGE_VERSION=$version" --label "org.opencontainers.image.version=$version")
    [[ "$engine" == podman && "$image" == agent ]] && version_args+=(--env "FLEETLOG_IMAGE_VERSION=$version")
    [[ "$image" == ingest ]] && version_args+=(--build-arg "EXTRA=$extra" --label "io.fleetlog.extra=$extra")
    "$engine" build "${format_args[@]}" "${base_args[@]}" "${secret_args[@]}" "${version_args[@]}" \
        -f "docker/$image.Dockerfile" -t "fleetlog-$image:$tag" .
done
"$engine" images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E '^(localhost/)?fleetlog-(ingest|agent):' || true
