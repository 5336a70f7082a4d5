"""The web config file of `gpumon serve --web-config-file`: Prometheus exporter-toolkit's format.

Every key exporter-toolkit defines is either honoured or refused with a one-line error (exit 7);
none is ignored, so a typo (`clientca_file`) or a setting gpumon cannot apply never leaves a
server less protected than its file says. docs/configuration.md lists what is honoured.
"""

from __future__ import annotations

import os
import re
import ssl
import stat
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from gpumon.core.errors import EXIT_CONFIG, GpumonError
from gpumon.core.files import NotRegularFile, kind_of, read_regular


class WebConfigError(GpumonError):
    exit_code = EXIT_CONFIG


BCRYPT_HASH = re.compile(r"^\$2[abxy]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}$")

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# Go's names (crypto/tls, as exporter-toolkit takes them) -> OpenSSL's, for the TLS 1.2 suites Go
# offers; TLS 1.3 suites are not configurable, in Go as in OpenSSL's cipher list.
CIPHER_SUITES = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": "ECDHE-ECDSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": "ECDHE-RSA-AES128-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_RSA_WITH_AES_128_CBC_SHA256": "AES128-SHA256",
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
}
CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1", "X25519": "X25519"}
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
REFUSED_CLIENT_AUTH = {
    "RequestClientCert": "asks for a certificate without verifying it, which Python's TLS cannot do",
    "RequireAnyClientCert": "accepts any certificate without verifying it, which Python's TLS cannot do",
}
HEADERS = (
    "Content-Security-Policy",
    "Strict-Transport-Security",
    "X-Content-Type-Options",
    "X-Frame-Options",
    "X-XSS-Protection",
)
"""The response headers exporter-toolkit lets a web config set."""

_TOP = ("tls_server_config", "http_server_config", "basic_auth_users")
_TLS = (
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "client_allowed_sans",
    "min_version",
    "max_version",
    "cipher_suites",
    "prefer_server_cipher_suites",
    "curve_preferences",
)
_HTTP = ("http2", "headers")


class WebConfig(NamedTuple):
    cert_file: str | None = None
    key_file: str | None = None
    client_ca_file: str | None = None
    client_auth: ssl.VerifyMode = ssl.CERT_NONE
    client_allowed_sans: tuple[str, ...] = ()
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    max_version: ssl.TLSVersion | None = None
    ciphers: tuple[str, ...] = ()
    """OpenSSL names; empty: OpenSSL's defaults."""
    prefer_server_ciphers: bool = False
    curve: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    users: Mapping[str, bytes] = MappingProxyType({})
    """user -> bcrypt hash."""
    path: str | None = None

    @property
    def tls(self) -> bool:
        return self.cert_file is not None

    def ssl_context(self) -> ssl.SSLContext:
        """The server context, built as the file says; names the file when a part cannot be used."""
        where = self.path or "web config"
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = self.min_version
        if self.max_version is not None:
            ctx.maximum_version = self.max_version
        if self.ciphers:
            try:
                ctx.set_ciphers(":".join(self.ciphers))
            except ssl.SSLError:
                raise WebConfigError(f"{where}: tls_server_config.cipher_suites: none can be used") from None
        if self.prefer_server_ciphers:
            ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
        if self.curve is not None:
            ctx.set_ecdh_curve(self.curve)

        def no_passphrase() -> str:
            raise WebConfigError(
                f"{where}: tls_server_config.key_file {self.key_file} is encrypted; "
                "gpumon needs a key without a pass-phrase (openssl pkey -in KEY -out PLAIN)"
            )

        for key, tls_file in (
            ("cert_file", self.cert_file),
            ("key_file", self.key_file),
            ("client_ca_file", self.client_ca_file),
        ):
            kind = _not_regular(tls_file)
            if kind is not None:  # OpenSSL would block on a FIFO, or read a device for ever
                raise WebConfigError(f"{where}: tls_server_config.{key} {tls_file} is a {kind}, not a file")
            if tls_file is None:
                continue
            try:  # named here: OpenSSL's own errors do not say which file
                size = os.stat(tls_file).st_size
                with open(tls_file, "rb"):
                    pass
            except OSError as e:
                raise WebConfigError(f"{where}: tls_server_config.{key} {tls_file}: {e.strerror}") from None
            if size > MAX_TLS_FILE_BYTES:
                too_large = "larger than 1 MiB, not a certificate or key"
                raise WebConfigError(f"{where}: tls_server_config.{key} {tls_file}: {too_large}")
        try:
            ctx.load_cert_chain(self.cert_file or "", self.key_file, password=no_passphrase)
        except (OSError, ssl.SSLError) as e:
            raise WebConfigError(f"{where}: TLS certificate or key cannot be used: {e}") from None
        if self.client_ca_file:
            try:
                ctx.load_verify_locations(self.client_ca_file)
            except (OSError, ssl.SSLError) as e:
                raise WebConfigError(f"{where}: tls_server_config.client_ca_file: {e}") from None
        ctx.verify_mode = self.client_auth
        return ctx


MAX_WEB_CONFIG_BYTES = 1 << 20
"""A web config file is a few hundred bytes: beyond this it is refused unread."""


def _beside(config: str, file: str | None) -> str | None:
    """A file the web config names: a relative path is read from the config file's directory, as
    exporter-toolkit reads it (under systemd the working directory is /)."""
    if file is None or os.path.isabs(file):
        return file
    return os.path.join(os.path.dirname(os.path.abspath(config)), file)


MAX_TLS_FILE_BYTES = 1 << 20
"""A certificate chain or key is a few KB: a larger file is refused before OpenSSL reads it."""


def _not_regular(path: str | None) -> str | None:
    """What stands at `path` when it is there and not a regular file (None otherwise: a missing
    file is OpenSSL's to report)."""
    if path is None:
        return None
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else kind_of(mode)


def _strict_loader(yaml: Any) -> Any:
    """PyYAML's SafeLoader refusing a key given twice in one mapping (it keeps the last): a second
    `basic_auth_users: {}` after the users silently turned basic auth off. exporter-toolkit's
    strict YAML refuses it too."""

    class StrictLoader(yaml.SafeLoader):  # type: ignore[misc]
        def flatten_mapping(self, node: Any) -> Any:
            # each mapping checked once, as written, before a merge (`<<:`) adds to it: merging
            # changes the node in place, and its own keys may then be given again legitimately
            if not hasattr(self, "_checked"):
                self._checked: set[int] = set()
            if id(node) not in self._checked:
                self._checked.add(id(node))
                _refuse_duplicates(self, node)
            return super().flatten_mapping(node)

    def _refuse_duplicates(loader: Any, node: Any) -> None:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<:` merges another mapping in: its keys may be given again
            key = loader.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: SafeLoader says so itself
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} given twice in one mapping", key_node.start_mark
                )

    return StrictLoader


def load_web_config(path: str | None) -> WebConfig:
    """Read and check the whole file, TLS material included, so that a bad file fails at start
    (or at --check-config), naming the file and the key, never at the first client."""
    if path is None:
        return WebConfig()
    # here, not at the top: a web config file only
    import yaml

    try:  # a regular file only, bounded: a FIFO would block the start, /dev/zero never end
        data = read_regular(path, MAX_WEB_CONFIG_BYTES)
    except NotRegularFile as e:
        raise WebConfigError(f"{path}: a {e.kind}, not a web config file") from None
    except OSError as e:
        raise WebConfigError(f"{path}: cannot read: {e.strerror}") from None
    if len(data) > MAX_WEB_CONFIG_BYTES:
        raise WebConfigError(f"{path}: larger than {MAX_WEB_CONFIG_BYTES // 1024} KiB: not a web config file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise WebConfigError(f"{path}: not UTF-8 text (a web config file is YAML)") from None
    if "\0" in text:
        raise WebConfigError(f"{path}: a binary file, not a YAML web config file")
    try:
        doc = yaml.load(text, Loader=_strict_loader(yaml))  # (a SafeLoader, strict)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise WebConfigError(f"{path}{line}: not valid YAML: {str(e).splitlines()[0]}") from None
    doc = {} if doc is None else doc
    p = _Parser(path)
    top = p.mapping(doc, "", _TOP)
    tls = p.mapping(top.get("tls_server_config"), "tls_server_config", _TLS)
    http = p.mapping(top.get("http_server_config"), "http_server_config", _HTTP)
    users = p.mapping(top.get("basic_auth_users"), "basic_auth_users", None)

    hashes: dict[str, bytes] = {}
    for user, hashed in users.items():
        if not isinstance(hashed, str) or not BCRYPT_HASH.match(hashed):
            raise WebConfigError(
                f"{path}: basic_auth_users.{user}: expected a bcrypt hash ($2b$12$ and 53 characters), "
                "not a password or another hash"
            )
        hashes[str(user)] = hashed.encode()

    cert, key = _beside(path, p.string(tls, "cert_file")), _beside(path, p.string(tls, "key_file"))
    if bool(cert) != bool(key):
        raise WebConfigError(f"{path}: tls_server_config needs both cert_file and key_file")
    ca = _beside(path, p.string(tls, "client_ca_file"))
    auth_name = p.string(tls, "client_auth_type") or ("RequireAndVerifyClientCert" if ca else "NoClientCert")
    if auth_name in REFUSED_CLIENT_AUTH:
        raise WebConfigError(
            f"{path}: tls_server_config.client_auth_type {auth_name} is not supported: it "
            f"{REFUSED_CLIENT_AUTH[auth_name]}; use RequireAndVerifyClientCert or VerifyClientCertIfGiven"
        )
    if auth_name not in CLIENT_AUTH:
        known = ", ".join([*CLIENT_AUTH, *REFUSED_CLIENT_AUTH])
        raise WebConfigError(
            f"{path}: tls_server_config.client_auth_type: unknown {auth_name!r}; known: {known}"
        )
    client_auth = CLIENT_AUTH[auth_name]
    if client_auth != ssl.CERT_NONE and not ca:
        raise WebConfigError(f"{path}: tls_server_config.client_auth_type {auth_name} needs client_ca_file")
    sans = tuple(p.strings(tls, "client_allowed_sans"))
    if sans and client_auth == ssl.CERT_NONE:
        raise WebConfigError(f"{path}: tls_server_config.client_allowed_sans needs client certificates")
    versions = [p.choice(tls, k, TLS_VERSIONS) for k in ("min_version", "max_version")]
    min_v = versions[0] or ssl.TLSVersion.TLSv1_2
    if versions[1] is not None and versions[1] < min_v:
        raise WebConfigError(f"{path}: tls_server_config.max_version is older than min_version")
    ciphers = tuple(p.choice_list(tls, "cipher_suites", CIPHER_SUITES))
    curves = p.choice_list(tls, "curve_preferences", CURVES)
    if len(curves) > 1:
        raise WebConfigError(
            f"{path}: tls_server_config.curve_preferences: Python's TLS can limit the server to one "
            f"curve only; name one of {', '.join(CURVES)}"
        )
    prefer = p.boolean(tls, "prefer_server_cipher_suites")
    if not cert and any(k in tls for k in _TLS):
        raise WebConfigError(
            f"{path}: tls_server_config sets {sorted(tls)[0]} but not cert_file and key_file"
        )
    if p.boolean(http, "http2"):
        raise WebConfigError(
            f"{path}: http_server_config.http2: gpumon serves HTTP/1.1 only (Prometheus scrapes it); "
            "remove the key or set it to false"
        )
    headers = p.mapping(http.get("headers"), "http_server_config.headers", None)
    for name, value in headers.items():
        if name not in HEADERS:
            raise WebConfigError(
                f"{path}: http_server_config.headers: {name!r} cannot be set; allowed: {', '.join(HEADERS)}"
            )
        if not isinstance(value, str) or any(c in value for c in "\r\n"):
            raise WebConfigError(f"{path}: http_server_config.headers.{name}: a one-line string is expected")
    cfg = WebConfig(
        cert_file=cert,
        key_file=key,
        client_ca_file=ca,
        client_auth=client_auth,
        client_allowed_sans=sans,
        min_version=min_v,
        max_version=versions[1],
        ciphers=ciphers,
        prefer_server_ciphers=prefer,
        curve=curves[0] if curves else None,
        headers=tuple((str(k), str(v)) for k, v in headers.items()),
        users=hashes,
        path=path,
    )
    if cfg.tls:
        cfg.ssl_context()  # fail now, with the file named, rather than at the first client
    return cfg


class _Parser:
    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, key: str, what: str) -> WebConfigError:
        return WebConfigError(f"{self.path}: {key}: {what}")

    def mapping(self, value: Any, key: str, allowed: tuple[str, ...] | None) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise WebConfigError(f"{self.path}: {key or 'the top level'} must be a mapping")
        if allowed is not None:
            for k in value:
                if k not in allowed:
                    where = f"{key}." if key else ""
                    raise WebConfigError(
                        f"{self.path}: unknown key {where}{k!r}; known here: {', '.join(allowed)}"
                    )
        return value

    def string(self, d: dict[str, Any], key: str) -> str | None:
        value = d.get(key)
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise self.fail(f"tls_server_config.{key}", f"expected a string, got {value!r}")
        return value

    def strings(self, d: dict[str, Any], key: str) -> list[str]:
        value = d.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(f"tls_server_config.{key}", "expected a list of strings")
        return value

    def boolean(self, d: dict[str, Any], key: str) -> bool:
        value = d.get(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {value!r}")
        return value

    def choice(self, d: dict[str, Any], key: str, known: Mapping[str, Any]) -> Any:
        value = self.string(d, key)
        if value is None:
            return None
        if value not in known:
            raise self.fail(f"tls_server_config.{key}", f"unknown {value!r}; known: {', '.join(known)}")
        return known[value]

    def choice_list(self, d: dict[str, Any], key: str, known: Mapping[str, str]) -> list[str]:
        out = []
        for value in self.strings(d, key):
            if value not in known:
                raise self.fail(f"tls_server_config.{key}", f"unknown {value!r}; known: {', '.join(known)}")
            out.append(known[value])
        return out
