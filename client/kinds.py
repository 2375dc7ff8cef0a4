"""Operation kinds and the argument checks of the public client API.

Bad arguments are programming errors, so they raise `ValueError` at once, before anything is
counted or sent.
"""

from __future__ import annotations

import operator

from burstctl.proto.burstctl.v1 import controller_pb2 as pb

KINDS: dict[str, pb.OpKind] = {
    "read": pb.OP_KIND_READ,
    "write": pb.OP_KIND_WRITE,
    "metadata": pb.OP_KIND_METADATA,
}
MAX_VOLUME = 2**53  # OpPosted.volume above this is rejected by the controller


def op_kind(kind: str) -> pb.OpKind:
    """Maps ``"read" | "write" | "metadata"`` to its wire enum."""
    try:
        return KINDS[kind]
    except (KeyError, TypeError):
        raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}") from None


def check_nbytes(nbytes: int, name: str = "nbytes") -> int:
    """Returns ``nbytes`` as an int if it is an integer >= 0."""
    if isinstance(nbytes, bool):
        raise ValueError(f"{name} must be an integer >= 0, got {nbytes!r}")
    try:
        value = operator.index(nbytes)
    except TypeError:
        raise ValueError(f"{name} must be an integer >= 0, got {nbytes!r}") from None
    if value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value}")
    return value


def check_volume(volume: int) -> int:
    """Returns a declared operation volume (0 = unknown) if it is valid on the wire."""
    value = check_nbytes(volume, "volume")
    if value > MAX_VOLUME:
        raise ValueError(f"volume must be at most 2**53 bytes, got {value}")
    return value
