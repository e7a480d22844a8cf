#!/usr/bin/env bash
# What the test suite needs from Debian, installed when missing (`make test` runs this first).
#
# As root: installs the missing packages with apt-get. Not as root: prints the one apt-get command
# that installs them and stops with status 1, so `make test` never runs a suite that cannot pass.
# With everything present it does nothing and says nothing.
set -euo pipefail

missing=()          # packages installed without their recommends
missing_full=()     # packages installed with their recommends

# package   command (or check) that shows it is there         what needs it
need() {  # need PACKAGE CHECK...: PACKAGE is missing unless CHECK succeeds
    local package=$1
    shift
    "$@" >/dev/null 2>&1 || missing+=("$package")
}
has() { command -v "$1"; }

need python3-venv python3 -c 'import ensurepip, venv'   # make test creates .venv
need prometheus   has promtool                           # tests/test_dashboards.py: PromQL on a real Prometheus
need shellcheck   has shellcheck                         # tests/test_docker.py: the entrypoint's lint
has chromium >/dev/null || missing_full+=(chromium)      # tests/test_page.py; its recommends bring the fonts

need podman       has podman                             # tests/test_container.py: build and run the images
need runc         has runc                               #   (podman's runtime here: docker/podman-containers.conf)
need debootstrap  has debootstrap                        #   a Debian base when no registry answers

if ((${#missing[@]} + ${#missing_full[@]} == 0)); then
    exit 0
fi
if ((EUID != 0)); then
    {
        echo "make test: the tests need Debian packages that are not installed. As root, run:"
        echo
        echo "    apt-get update"
        ((${#missing[@]})) && echo "    apt-get install -y --no-install-recommends ${missing[*]}"
        ((${#missing_full[@]})) && echo "    apt-get install -y ${missing_full[*]}"
        echo
        echo "(or run make test as root, which installs them)"
    } >&2
    exit 1
fi
if ! has apt-get >/dev/null; then
    echo "make test: missing ${missing[*]} ${missing_full[*]}, and no apt-get to install them (Debian expected)" >&2
    exit 1
fi
echo "make test: installing ${missing[*]} ${missing_full[*]} (apt-get)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
if ((${#missing[@]})); then
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ((${#missing_full[@]})); then
    apt-get install -y -qq "${missing_full[@]}" >/dev/null
fi
