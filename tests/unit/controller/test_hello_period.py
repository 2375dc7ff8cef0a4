"""A Hello's declared period (issue 17, policy persched) is checked like every other field,
and reaches the job table's view for the policies."""

from __future__ import annotations

import math

import pytest
from support.grpc import hello

from burstctl.controller.jobs import JobTable, ProtocolError
from burstctl.controller.messages import validate_hello
from burstctl.policies.view import Periodic


def test_a_declared_period_reaches_the_metadata_and_the_view() -> None:
    meta, _, _ = validate_hello(
        hello("j", 2, user="ann", group="phys", period_w=0.5, period_vol=4096.0)
    )
    assert (meta.w, meta.vol_io) == (0.5, 4096.0)
    table = JobTable(lambda: 0.0, heartbeat_timeout=1.0, job_retention=1.0, demand_headroom=1.1)
    table.open_session(meta, "c", "h")
    view = table.view(1e9, 1e8)
    assert dict(view.periodic) == {"j": Periodic(2, 0.5, 4096.0)}
    assert view.jobs == {}  # computing: in the periodic set, not in S(t)


@pytest.mark.parametrize(
    ("period", "field"),
    [
        ({"period_w": 0.5}, "hello.period_vol"),
        ({"period_vol": 10.0}, "hello.period_w"),
        ({"period_w": -0.5, "period_vol": 10.0}, "hello.period_w"),
        ({"period_w": math.nan, "period_vol": 10.0}, "hello.period_w"),
        ({"period_w": 0.5, "period_vol": math.inf}, "hello.period_vol"),
    ],
)
def test_a_bad_period_is_a_protocol_error_naming_the_field(
    period: dict[str, float], field: str
) -> None:
    with pytest.raises(ProtocolError) as caught:
        validate_hello(hello("j", 2, user="ann", group="phys", **period))
    assert caught.value.field == field
