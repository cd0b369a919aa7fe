#!/usr/bin/env bash
# Build the EnvACE images: docker/build_images.sh [cpu] [gpu]   (default: both; `make images`)
#
# The build context is staged in a temporary folder with only what the images need (pyproject.toml,
# README.md, envace/, pipelines/, configs/, docker/, wheels/): the repository root holds a
# multi-GB .venv and caches that must not be sent to the daemon, and no .dockerignore is needed.
#
# Environment:
#   DOCKER            docker CLI (default: docker); DOCKER_HOST selects the daemon as usual
#   TAG               image tag (default: the package version from pyproject.toml)
#   CPU_BASE_IMAGE    base of the CPU image (default: the Dockerfile's python:3.11-slim-bookworm;
#                     offline: envace-base:bookworm from scripts/build_base_image.sh)
#   GPU_BASE_IMAGE    base of the GPU image (default: the Dockerfile's pytorch/pytorch CUDA devel)
#   WHEELS_DIR        folder of local wheels offered to pip first, e.g. /opt/wheels with a CPU torch
#   TORCH_INDEX_URL   index for the CPU torch wheel (default: the Dockerfile's PyTorch CPU index)
#   BUILD_NETWORK     `docker build --network` value, e.g. host for a daemon started with --bridge=none
#   PIP_CA_BUNDLE     PEM bundle pip must trust while building (behind a TLS-intercepting proxy)
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DOCKER="${DOCKER:-docker}"
TAG="${TAG:-$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/pyproject.toml" | head -n1)}"
targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=(cpu gpu)

STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
# Tracked and not-ignored files only: what a clean clone would contain.
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard -- \
    pyproject.toml README.md envace pipelines configs docker) |
    while IFS= read -r -d '' path; do
        if [[ -e "$ROOT/$path" ]]; then printf '%s\0' "$path"; fi
    done |
    tar -C "$ROOT" --null -T - -cf - | tar -C "$STAGE" -xf -
mkdir -p "$STAGE/wheels" "$STAGE/certs" "$STAGE/pipelines" "$STAGE/configs"
if [[ -n "${WHEELS_DIR:-}" ]]; then
    cp "$WHEELS_DIR"/*.whl "$STAGE/wheels/"
fi
if [[ -n "${PIP_CA_BUNDLE:-}" ]]; then
    cp "$PIP_CA_BUNDLE" "$STAGE/certs/ca.pem"
    printf '[global]\ncert = /tmp/certs/ca.pem\n' >"$STAGE/certs/pip.conf"
fi

common=()
[[ -n "${BUILD_NETWORK:-}" ]] && common+=(--network "$BUILD_NETWORK")

for target in "${targets[@]}"; do
    args=("${common[@]}")
    case "$target" in
        cpu)
            [[ -n "${CPU_BASE_IMAGE:-}" ]] && args+=(--build-arg "BASE_IMAGE=$CPU_BASE_IMAGE")
            [[ -n "${TORCH_INDEX_URL:-}" ]] && args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
            ;;
        gpu)
            [[ -n "${GPU_BASE_IMAGE:-}" ]] && args+=(--build-arg "BASE_IMAGE=$GPU_BASE_IMAGE")
            ;;
        *)
            echo "build_images.sh: unknown image '$target' (expected cpu or gpu)" >&2
            exit 2
            ;;
    esac
    echo "building envace-$target:$TAG"
    "$DOCKER" build "${args[@]}" -f "$STAGE/docker/$target.Dockerfile" -t "envace-$target:$TAG" "$STAGE"
done
