"""The client's reading of a controller's retry hint (RESOURCE_EXHAUSTED + retry-after-ms)."""

from __future__ import annotations

import grpc
import pytest

from burstctl.client.channel import MAX_RETRY_AFTER, retry_hint


def rpc_error(code: grpc.StatusCode, trailing: tuple[tuple[str, str], ...]) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing), details="refused"
    )


@pytest.mark.parametrize(
    ("code", "trailing", "hint"),
    [
        (grpc.StatusCode.RESOURCE_EXHAUSTED, (("retry-after-ms", "1500"),), 1.5),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, (("retry-after-ms", "1e9"),), MAX_RETRY_AFTER),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, (("retry-after-ms", "soon"),), None),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, (("retry-after-ms", "-5"),), None),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, (("retry-after-ms", "nan"),), None),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, (), None),
        (grpc.StatusCode.UNAVAILABLE, (("retry-after-ms", "1500"),), None),
    ],
)
def test_retry_hint(
    code: grpc.StatusCode, trailing: tuple[tuple[str, str], ...], hint: float | None
) -> None:
    assert retry_hint(rpc_error(code, trailing)) == hint
