"""The artifact store: one interface over a local folder and MinIO / S3.

    store, prefix = open_store("minio://envace/runs/exp1")
    commit_dir("out/iter_000010", "minio://envace/runs/exp1/checkpoints/iter_000010")
    latest_complete("minio://envace/runs/exp1/checkpoints")  # newest verified checkpoint URI
    fetch_dir(uri, "/tmp/ckpt")                               # checked download

See docs/storage.md. The S3 backend (`envace.storage.s3`) loads the minio SDK on first use.
"""

from envace.storage.artifacts import commit_dir, fetch_dir, open_store, read_manifest, verify
from envace.storage.base import ArtifactStore, Digest, ObjectInfo, ProgressCallback
from envace.storage.checkpoints import (
    checkpoint_name,
    checkpoint_step,
    checkpoint_uri,
    fetch_latest,
    latest_complete,
    list_checkpoints,
)
from envace.storage.errors import (
    ArtifactIntegrityError,
    ArtifactNotFoundError,
    InvalidKeyError,
    ObjectNotFoundError,
    StoreAccessError,
    StoreError,
    StoreUnavailableError,
    UnsafeTreeError,
)
from envace.storage.local import LocalStore
from envace.storage.manifest import MANIFEST_NAME, Manifest, ManifestEntry
from envace.storage.retry import RetryEvent, RetryPolicy
from envace.storage.settings import S3Settings
from envace.storage.uri import StoreURI, join_key, join_uri, parse_uri, validate_key

__all__ = [
    "MANIFEST_NAME",
    "ArtifactIntegrityError",
    "ArtifactNotFoundError",
    "ArtifactStore",
    "Digest",
    "InvalidKeyError",
    "LocalStore",
    "Manifest",
    "ManifestEntry",
    "ObjectInfo",
    "ObjectNotFoundError",
    "ProgressCallback",
    "RetryEvent",
    "RetryPolicy",
    "S3Settings",
    "StoreAccessError",
    "StoreError",
    "StoreURI",
    "StoreUnavailableError",
    "UnsafeTreeError",
    "checkpoint_name",
    "checkpoint_step",
    "checkpoint_uri",
    "commit_dir",
    "fetch_dir",
    "fetch_latest",
    "join_key",
    "join_uri",
    "latest_complete",
    "list_checkpoints",
    "open_store",
    "parse_uri",
    "read_manifest",
    "validate_key",
    "verify",
]
