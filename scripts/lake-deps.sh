#!/bin/sh
# What the lake tests (pytest -m lake) need beyond the venv: Debian's PostgreSQL server binaries
# (/usr/lib/postgresql/<major>/bin). The tests start their own cluster in a temporary directory as
# the user nobody; the packaged cluster is not used (and not started here).
set -eu
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "lake-deps: PostgreSQL is missing; run as root: apt-get install -y postgresql" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends postgresql
