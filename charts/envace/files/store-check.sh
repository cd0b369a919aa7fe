#!/bin/sh
# `helm test` store check: the application credentials every EnvACE pod uses reach the store and
# can list each bucket. Credentials are files ($STORE_CREDENTIALS_DIR/{access-key,secret-key}).
set -eu

export MC_CONFIG_DIR=/tmp/mc
url="${STORE_SCHEME}://${STORE_ENDPOINT}"
if ! mc alias set store "$url" "$(cat "$STORE_CREDENTIALS_DIR/access-key")" "$(cat "$STORE_CREDENTIALS_DIR/secret-key")" >/dev/null; then
    echo "store-check: cannot log in to the store at $url with the keys of Secret $SECRET_NAME" >&2
    exit 1
fi
missing=""
for bucket in $BUCKETS; do
    if mc ls "store/$bucket" >/dev/null; then
        echo "store-check: bucket $bucket is readable at $url"
    else
        missing="$missing $bucket"
    fi
done
if [ -n "$missing" ]; then
    echo "store-check: bucket(s)$missing missing or not readable at $url with the keys of Secret $SECRET_NAME (the bucket-init Job creates them: see its logs)" >&2
    exit 1
fi
