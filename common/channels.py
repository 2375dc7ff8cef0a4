"""Credentials of a gRPC channel to a controller: TLS, a client certificate, a shared secret.

Shared by the client runtime (sessions, the FUSE mount) and the controller's peer links, so it
imports nothing of either. ``ChannelSecurity.load`` reads the PEM files once (a bad path fails
there, with the file named); ``open`` makes a ``grpc.aio`` channel on the running loop:

- no ``tls_ca``: plaintext (the single-node loopback default);
- ``tls_ca``: TLS, the server's certificate checked against that CA;
- ``tls_cert`` + ``tls_key`` (with ``tls_ca``): mutual TLS, this side presents that certificate;
- ``secret``: sent on every call as ``authorization: Bearer <secret>`` metadata (without TLS it
  crosses the network in clear: use it on loopback or a trusted network only).

See docs/security.md.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

# The metadata key the shared secret travels in (lowercase: gRPC metadata keys are).
SECRET_KEY = "authorization"
SECRET_SCHEME = "Bearer "


def read_secret(path: Path | str) -> str:
    """The shared secret in ``path`` (surrounding whitespace dropped); ValueError if unusable."""
    try:
        secret = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the secret file {path}: {exc}") from None
    if not secret:
        raise ValueError(f"the secret file {path} is empty")
    if any(not (0x21 <= ord(c) <= 0x7E) for c in secret):
        raise ValueError(f"the secret in {path} must be printable ASCII without spaces")
    return secret


def _read_pem(name: str, path: Path | str | None) -> bytes | None:
    if path is None:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{name}: cannot read {path}: {exc}") from None
    if b"-----BEGIN " not in data:
        raise ValueError(f"{name}: {path} is not a PEM file")
    return data


@dataclass(frozen=True, slots=True)
class ChannelSecurity:
    """What a channel presents and checks; hashable, so equal settings can share a channel."""

    tls_ca: bytes | None = None
    tls_cert: bytes | None = None
    tls_key: bytes | None = None
    secret: str | None = None

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together")
        if self.tls_cert is not None and self.tls_ca is None:
            raise ValueError("a client certificate needs tls_ca (the server's CA) too")
        if self.secret is not None and not self.secret:
            raise ValueError("the secret must not be empty")

    @classmethod
    def load(
        cls,
        *,
        tls_ca: Path | str | None = None,
        tls_cert: Path | str | None = None,
        tls_key: Path | str | None = None,
        secret: str | None = None,
        secret_file: Path | str | None = None,
    ) -> ChannelSecurity:
        """Reads the files; ValueError naming the file when one cannot be used."""
        if secret is not None and secret_file is not None:
            raise ValueError("give the secret or a secret file, not both")
        if secret_file is not None:
            secret = read_secret(secret_file)
        return cls(
            tls_ca=_read_pem("tls_ca", tls_ca),
            tls_cert=_read_pem("tls_cert", tls_cert),
            tls_key=_read_pem("tls_key", tls_key),
            secret=secret,
        )

    @property
    def plain(self) -> bool:
        """Nothing configured: a plaintext channel without a secret (the loopback default)."""
        return self.tls_ca is None and self.secret is None

    def call_metadata(self) -> tuple[tuple[str, str], ...]:
        """The metadata every call carries (the secret, if any)."""
        return () if self.secret is None else ((SECRET_KEY, SECRET_SCHEME + self.secret),)

    def open(self, target: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
        """A ``grpc.aio`` channel to ``target`` with these credentials (on the running loop)."""
        interceptors = _secret_interceptors(self.secret) if self.secret is not None else None
        if self.tls_ca is None:
            return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.tls_ca,
            private_key=self.tls_key,
            certificate_chain=self.tls_cert,
        )
        return grpc.aio.secure_channel(
            target, credentials, options=options, interceptors=interceptors
        )


PLAIN = ChannelSecurity()


class _Secret:
    """Adds the shared secret to the metadata of a call. (grpc.aio files an interceptor under
    the first kind it is an instance of, so each kind has a class of its own.)"""

    def __init__(self, secret: str) -> None:
        self._pair = (SECRET_KEY, SECRET_SCHEME + secret)

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(tuple(details.metadata) if details.metadata else ()))
        metadata.add(*self._pair)
        return grpc.aio.ClientCallDetails(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            details.wait_for_ready,
        )


class _SecretUnaryUnary(_Secret, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        return await continuation(self._details(client_call_details), request)


class _SecretUnaryStream(_Secret, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        return await continuation(self._details(client_call_details), request)


class _SecretStreamUnary(_Secret, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(
        self,
        continuation: Callable[..., Any],
        client_call_details: Any,
        request_iterator: Iterable[Any] | AsyncIterable[Any],
    ) -> Any:
        return await continuation(self._details(client_call_details), request_iterator)


class _SecretStreamStream(_Secret, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(
        self,
        continuation: Callable[..., Any],
        client_call_details: Any,
        request_iterator: Iterable[Any] | AsyncIterable[Any],
    ) -> Any:
        return await continuation(self._details(client_call_details), request_iterator)


def _secret_interceptors(secret: str) -> list[grpc.aio.ClientInterceptor]:
    return [
        _SecretUnaryUnary(secret),
        _SecretUnaryStream(secret),
        _SecretStreamUnary(secret),
        _SecretStreamStream(secret),
    ]
