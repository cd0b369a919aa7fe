"""Where the object store is and how to talk to it: `S3Settings`.

Values come, field by field, from an explicit mapping (`S3Settings.resolve(mapping)`, the Python
API), then the `ENVACE_S3_*` environment variables, then the standard `AWS_*` names. Every field
has an `ENVACE_S3_*` variable, so the commands (which read the environment) can set all of them.
In the cluster the credentials reach the pod from a Kubernetes Secret, as environment variables
(`secretKeyRef`) or as mounted files named by `ENVACE_S3_ACCESS_KEY_FILE` /
`ENVACE_S3_SECRET_KEY_FILE` / `ENVACE_S3_SESSION_TOKEN_FILE`, so secrets never sit in a config
file or in code. `repr()` masks them and nothing here logs them.

Without static keys, a web-identity token (`AWS_WEB_IDENTITY_TOKEN_FILE` with `AWS_ROLE_ARN`:
EKS IRSA, or MinIO's STS with an OpenID provider) is exchanged for temporary credentials
(`envace.storage.s3`), at `sts_endpoint`, by default AWS STS for an AWS endpoint, else the store's
own endpoint (MinIO serves STS on its S3 port).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any
from urllib.parse import urlsplit

from envace.errors import ConfigError, UserInputError
from envace.storage.uri import redact_url

__all__ = ["ENV_VARS", "FILE_VARS", "S3Settings", "read_secret_file"]

MiB = 1024 * 1024
MAX_SECRET_FILE_BYTES = 64 * 1024  # a key or token file; a larger one is the wrong file

# field -> environment variables that may set it, in priority order.
ENV_VARS: dict[str, tuple[str, ...]] = {
    "endpoint": ("ENVACE_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
    "access_key": ("ENVACE_S3_ACCESS_KEY", "AWS_ACCESS_KEY_ID"),
    "secret_key": ("ENVACE_S3_SECRET_KEY", "AWS_SECRET_ACCESS_KEY"),
    "session_token": ("ENVACE_S3_SESSION_TOKEN", "AWS_SESSION_TOKEN"),
    "region": ("ENVACE_S3_REGION", "AWS_REGION", "AWS_DEFAULT_REGION"),
    "secure": ("ENVACE_S3_SECURE",),
    "cert_check": ("ENVACE_S3_CERT_CHECK",),
    "connect_timeout_s": ("ENVACE_S3_CONNECT_TIMEOUT_S",),
    "read_timeout_s": ("ENVACE_S3_READ_TIMEOUT_S",),
    "part_size": ("ENVACE_S3_PART_SIZE",),
    "parallel_uploads": ("ENVACE_S3_PARALLEL_UPLOADS",),
    "web_identity_token_file": ("ENVACE_S3_WEB_IDENTITY_TOKEN_FILE", "AWS_WEB_IDENTITY_TOKEN_FILE"),
    "role_arn": ("ENVACE_S3_ROLE_ARN", "AWS_ROLE_ARN"),
    "sts_endpoint": ("ENVACE_S3_STS_ENDPOINT", "AWS_ENDPOINT_URL_STS"),
}
# secret field -> a variable naming a file that holds it (a Secret mounted as files), read right
# after the field's ENVACE_S3_* variable and before the AWS_* ones.
FILE_VARS: dict[str, str] = {
    "access_key": "ENVACE_S3_ACCESS_KEY_FILE",
    "secret_key": "ENVACE_S3_SECRET_KEY_FILE",
    "session_token": "ENVACE_S3_SESSION_TOKEN_FILE",
}
_SECRET_FIELDS = ("access_key", "secret_key", "session_token")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _parse_bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{where}={value!r} is not a boolean: use true or false")


def _parse_number(value: Any, kind: type[int] | type[float], where: str) -> int | float:
    if isinstance(value, bool):  # bool is an int subclass: true is not a part size
        raise ConfigError(f"{where}={value!r} is not a number")
    try:
        return kind(value)
    except (TypeError, ValueError):
        example = "16777216" if kind is int else "30"
        raise ConfigError(
            f"{where}={value!r} is not {'an integer' if kind is int else 'a number'}"
            f" (e.g. {where}={example})"
        ) from None


def _split_endpoint(endpoint: str, where: str) -> tuple[str, bool | None]:
    """`http://host:port` -> ("host:port", False); a bare `host:port` -> (it, None).

    Messages show the endpoint through `redact_url`: a user:password written into it never
    reaches an error or a log."""
    form = "give host:port or http(s)://host:port, e.g. minio:9000 or http://[::1]:9000"
    shown = repr(redact_url(endpoint))
    if redact_url(endpoint) != endpoint:
        raise ConfigError(
            f"{where}={shown} (user:password removed here): credentials in the endpoint are not"
            f" used; {form}, and set them in {ENV_VARS['access_key'][0]} /"
            f" {ENV_VARS['secret_key'][0]}"
        )
    if "://" not in endpoint:
        host, scheme_secure = endpoint, None
    else:
        try:
            parts = urlsplit(endpoint)
        except ValueError as exc:  # an unclosed IPv6 bracket
            raise ConfigError(f"{where}={shown}: {exc}; {form}") from None
        if parts.scheme not in ("http", "https") or parts.path not in ("", "/") or parts.query:
            raise ConfigError(f"{where}={shown}: {form}, without a path")
        host, scheme_secure = parts.netloc, parts.scheme == "https"
    if not host or "/" in host or "@" in host or " " in host or not host.isprintable():
        raise ConfigError(f"{where}={shown}: {form}")
    _check_host_port(host, shown, where, form)
    return host, scheme_secure


def _check_host_port(host: str, shown: str, where: str, form: str) -> None:
    """A host name and, when given, a port 1-65535: minio would refuse either later, when the
    client is built, with a bare ValueError that names no variable."""
    try:
        parts = urlsplit(f"//{host}")
    except ValueError as exc:  # an unclosed IPv6 bracket
        raise ConfigError(f"{where}={shown}: {exc}; {form}") from None
    try:
        port = parts.port
    except ValueError:  # not a number, or over 65535
        port = 0
    if port == 0 or host.endswith(":"):
        raise ConfigError(f"{where}={shown}: the port must be a number 1-65535; {form}")
    if not parts.hostname:
        raise ConfigError(f"{where}={shown}: no host name; {form}")


def _env_candidates(name: str) -> tuple[str, ...]:
    """The variables that may set field `name`, in priority order (a file variable right after
    the field's own ENVACE_S3_* variable)."""
    names = ENV_VARS.get(name, ())
    if name in FILE_VARS:
        return (names[0], FILE_VARS[name], *names[1:])
    return names


def read_secret_file(path: str, var: str) -> str:
    """A key or token from the file `var` names, surrounding whitespace removed; a ConfigError
    naming the variable and the path (never the content) when it cannot be used."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_SECRET_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(
            f"{var}={path}: cannot read the file ({exc.strerror or exc}); mount the Secret there"
            f" or unset {var}"
        ) from None
    if len(raw) > MAX_SECRET_FILE_BYTES:
        raise ConfigError(f"{var}={path}: over {MAX_SECRET_FILE_BYTES} bytes, not a key file")
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{var}={path}: not UTF-8 text, not a key file") from None
    if not text:
        raise ConfigError(f"{var}={path}: the file is empty")
    return text


@dataclass(frozen=True)
class S3Settings:
    """Connection settings of an S3-protocol store (MinIO, AWS S3, or the test server).

    endpoint: `host:port`; an `http://` / `https://` prefix sets `secure`.
    secure: TLS on (default) or off. In-cluster MinIO is usually plain HTTP: set it false.
    cert_check: verify the server certificate when `secure` (turn off only for self-signed tests).
    region: bucket region; None asks the server once per bucket (MinIO answers us-east-1).
    connect_timeout_s / read_timeout_s: per HTTP request; they bound how long one attempt can
        hang before the retry policy takes over.
    part_size: multipart part size in bytes (5 MiB .. 5 GiB). Peak upload memory is about
        (parallel_uploads + 1) * part_size, whatever the file size; files over 10,000 parts
        get a larger part automatically.
    parallel_uploads: parts in flight at once for one file.
    web_identity_token_file: a web-identity token (JWT) file, read again at every credential
        refresh (the kubelet rotates it); used when no access / secret key is set.
    role_arn: the role the token assumes (AWS IRSA needs it; MinIO may take it from the token).
    sts_endpoint: where the token is exchanged (`https://host[:port]`); None: AWS STS for an AWS
        endpoint (regional with `region`), else the store's endpoint.
    """

    endpoint: str | None = None
    access_key: str | None = None
    secret_key: str | None = None
    session_token: str | None = None
    region: str | None = None
    secure: bool = True
    cert_check: bool = True
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 120.0
    part_size: int = 16 * MiB
    parallel_uploads: int = 3
    web_identity_token_file: str | None = None
    role_arn: str | None = None
    sts_endpoint: str | None = None

    def __post_init__(self) -> None:
        if self.part_size < 5 * MiB or self.part_size > 5 * 1024 * MiB:
            raise ConfigError(
                f"S3 part_size={self.part_size} (ENVACE_S3_PART_SIZE): must be 5 MiB .. 5 GiB"
                f" ({5 * MiB} .. {5 * 1024 * MiB} bytes)"
            )
        if self.parallel_uploads < 1:
            raise ConfigError(
                f"S3 parallel_uploads={self.parallel_uploads} (ENVACE_S3_PARALLEL_UPLOADS):"
                " must be >= 1"
            )
        for name, value in (
            ("connect_timeout_s", self.connect_timeout_s),
            ("read_timeout_s", self.read_timeout_s),
        ):
            # Written as "not (...)" so NaN is refused too; inf would let a stuck server hang
            # a command forever.
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(
                    f"S3 {name}={value!r} ({ENV_VARS[name][0]}): must be a finite number of"
                    " seconds > 0, e.g. 30"
                )

    def __repr__(self) -> str:
        shown = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _SECRET_FIELDS and value is not None:
                value = "***"
            elif f.name == "endpoint" and value is not None:
                value = redact_url(value)
            shown.append(f"{f.name}={value!r}")
        return f"S3Settings({', '.join(shown)})"

    __str__ = __repr__

    @property
    def endpoint_url(self) -> str:
        """The endpoint as a URL, for messages (`http://127.0.0.1:9000`; never credentials,
        even in settings built directly rather than parsed)."""
        host = redact_url(self.endpoint) if self.endpoint else "<unset>"
        return f"{'https' if self.secure else 'http'}://{host}"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> S3Settings:
        """Settings from `ENVACE_S3_*`, falling back to the standard `AWS_*` variables."""
        return cls.resolve(None, env)

    @classmethod
    def resolve(
        cls,
        config: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        *,
        key_path: str = "S3Settings",
    ) -> S3Settings:
        """Merge a config mapping over the environment, field by field (config wins)."""
        env = os.environ if env is None else env
        config = dict(config or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ConfigError(f"{key_path}: unknown key(s) {unknown}; known keys: {sorted(known)}")
        values: dict[str, Any] = {}
        origin: dict[str, str] = {}
        for name in known:
            if config.get(name) is not None:
                values[name], origin[name] = config[name], f"{key_path}.{name}"
                continue
            for var in _env_candidates(name):
                if env.get(var):
                    is_file = var in FILE_VARS.values()
                    value = read_secret_file(env[var], var) if is_file else env[var]
                    values[name], origin[name] = value, var
                    break
        return cls._build(values, origin)

    @classmethod
    def _build(cls, values: dict[str, Any], origin: dict[str, str]) -> S3Settings:
        secure_set = "secure" in values
        if secure_set:
            values["secure"] = _parse_bool(values["secure"], origin["secure"])
        if "cert_check" in values:
            values["cert_check"] = _parse_bool(values["cert_check"], origin["cert_check"])
        if values.get("endpoint"):
            host, scheme_secure = _split_endpoint(str(values["endpoint"]), origin["endpoint"])
            values["endpoint"] = host
            if scheme_secure is not None:
                if secure_set and values["secure"] != scheme_secure:
                    raise ConfigError(
                        f"{origin['endpoint']} says {'https' if scheme_secure else 'http'} but"
                        f" {origin['secure']}={values['secure']}: make them agree"
                    )
                values["secure"] = scheme_secure
        if values.get("sts_endpoint"):
            sts = str(values["sts_endpoint"])
            host, secure = _split_endpoint(sts, origin["sts_endpoint"])
            if secure is None:
                raise ConfigError(
                    f"{origin['sts_endpoint']}={redact_url(sts)!r}: give the scheme too,"
                    " e.g. https://sts.eu-west-3.amazonaws.com or http://minio:9000"
                )
            values["sts_endpoint"] = f"{'https' if secure else 'http'}://{host}"
        for name, kind in (
            ("connect_timeout_s", float),
            ("read_timeout_s", float),
            ("part_size", int),
            ("parallel_uploads", int),
        ):
            if name in values:
                values[name] = _parse_number(values[name], kind, origin[name])
        return cls(**values)

    @property
    def sts_url(self) -> str:
        """Where a web-identity token is exchanged: `sts_endpoint`, else AWS STS (regional when
        `region` is set) for an `*.amazonaws.com` endpoint, else the store's own endpoint."""
        if self.sts_endpoint:
            return self.sts_endpoint.rstrip("/")
        host = (self.endpoint or "").rsplit(":", 1)[0]
        if host.endswith(".amazonaws.com") or host.endswith(".amazonaws.com.cn"):
            if not self.region:
                return "https://sts.amazonaws.com"
            suffix = ".cn" if self.region.startswith("cn-") else ""
            return f"https://sts.{self.region}.amazonaws.com{suffix}"
        return self.endpoint_url

    @property
    def uses_web_identity(self) -> bool:
        """No static keys, a web-identity token file: temporary credentials from STS."""
        return bool(self.web_identity_token_file) and not (self.access_key or self.secret_key)

    def require(self, uri: str) -> S3Settings:
        """Self when endpoint and credentials (static keys, or a web-identity token file) are
        set, else a UserInputError naming the fix."""
        needed = (
            ("endpoint",) if self.uses_web_identity else ("endpoint", "access_key", "secret_key")
        )
        missing = [
            f"{name} ({' or '.join(_env_candidates(name))})"
            for name in needed
            if not getattr(self, name)
        ]
        if missing:
            raise UserInputError(
                f"cannot open {uri}: no S3 {', '.join(missing)} configured. Set these environment"
                " variables (in a cluster: the chart maps them from its store Secret), or a"
                f" web-identity token ({' or '.join(ENV_VARS['web_identity_token_file'])})"
            )
        return self

    def with_overrides(self, **changes: Any) -> S3Settings:
        """A copy with some fields changed (tests and benchmarks tune timeouts and part size)."""
        return replace(self, **changes)
