#!/usr/bin/env bash
# Make a Debian base image without a registry: debootstrap a minimal bookworm root with Python 3.11
# and venv, then `docker import` it.   scripts/build_base_image.sh [NAME]   (default envace-base:bookworm)
#
# For machines that reach a Debian mirror but no container registry (the CI machines): the CPU image
# then builds with CPU_BASE_IMAGE=envace-base:bookworm. Needs root (debootstrap) and a docker daemon.
# Environment: DOCKER (docker CLI), DEBIAN_MIRROR (default http://deb.debian.org/debian), SUITE.
set -euo pipefail

NAME="${1:-envace-base:bookworm}"
DOCKER="${DOCKER:-docker}"
SUITE="${SUITE:-bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PACKAGES="python3,python3-venv,ca-certificates"

command -v debootstrap >/dev/null || {
    echo "build_base_image.sh: debootstrap is missing: apt-get install -y --no-install-recommends debootstrap" >&2
    exit 1
}
[[ "$(id -u)" -eq 0 ]] || { echo "build_base_image.sh: debootstrap needs root" >&2; exit 1; }

ROOTFS="$(mktemp -d)"
trap 'rm -rf "$ROOTFS"' EXIT
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR"
# Trim what an image never uses: apt lists, docs, man pages, locales other than C.
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/usr/share/doc/* \
    "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/*
tar -C "$ROOTFS" --numeric-owner -c . |
    "$DOCKER" import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["/bin/bash"]' \
        - "$NAME"
"$DOCKER" run --rm --network none "$NAME" python3 -c "import sys, venv; print('base python', sys.version.split()[0])"
echo "built $NAME"
