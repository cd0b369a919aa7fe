#!/bin/sh
# Create the EnvACE buckets and, with the bundled MinIO, an application user limited to them.
# Idempotent: every `helm upgrade` re-runs it and leaves an initialised store unchanged.
set -eu

# Credentials come as files (mounted Secrets, never environment variables):
#   $STORE_CREDENTIALS_DIR/{access-key,secret-key}  the application user
#   $ROOT_CREDENTIALS_DIR/{user,password}           MinIO root (only with MANAGE_USER=true)
export MC_CONFIG_DIR=/tmp/mc
url="${STORE_SCHEME}://${STORE_ENDPOINT}"
ACCESS_KEY="$(cat "$STORE_CREDENTIALS_DIR/access-key")"
SECRET_KEY="$(cat "$STORE_CREDENTIALS_DIR/secret-key")"
if [ "$MANAGE_USER" = "true" ]; then
    admin_user="$(cat "$ROOT_CREDENTIALS_DIR/user")"
    admin_password="$(cat "$ROOT_CREDENTIALS_DIR/password")"
else
    admin_user="$ACCESS_KEY"
    admin_password="$SECRET_KEY"
fi

attempt=0
until mc alias set store "$url" "$admin_user" "$admin_password" >/dev/null 2>&1 && mc ls store >/dev/null 2>&1; do
    attempt=$((attempt + 1))
    if [ "$attempt" -ge 60 ]; then
        echo "bucket-init: the store at $url did not answer after 60 tries (5 min); check the MinIO pod" >&2
        exit 1
    fi
    sleep 5
done

for bucket in $BUCKETS; do
    mc mb --ignore-existing "store/$bucket"
done

if [ "$MANAGE_USER" != "true" ]; then
    echo "bucket-init: buckets [$BUCKETS] ready at $url"
    exit 0
fi

resources=""
for bucket in $BUCKETS; do
    resources="$resources\"arn:aws:s3:::$bucket\",\"arn:aws:s3:::$bucket/*\","
done
resources="${resources%,}"
cat >/tmp/policy.json <<JSON
{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["s3:*"], "Resource": [$resources]}]}
JSON
mc admin policy create store "$POLICY" /tmp/policy.json
mc admin user add store "$ACCESS_KEY" "$SECRET_KEY"
if ! mc admin user info store "$ACCESS_KEY" | grep -q "$POLICY"; then
    mc admin policy attach store "$POLICY" --user "$ACCESS_KEY"
fi
echo "bucket-init: buckets [$BUCKETS] ready at $url; user $ACCESS_KEY has policy $POLICY"
