"""Fallback specs, argument checks, session options and the stream backoff."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from burstctl.client import Fallback, JobInfo
from burstctl.client.channel import Backoff
from burstctl.client.kinds import check_nbytes, check_volume, op_kind
from burstctl.client.options import SessionOptions
from burstctl.proto.burstctl.v1 import controller_pb2 as pb

MiB = 1 << 20
JOB = JobInfo("1", "u", "g")


# -------------------------------------------------------------------------- fallback


def test_fallback_specs_parse() -> None:
    assert Fallback.parse("keep-last") == Fallback("keep-last")
    assert Fallback.parse("unthrottled") == Fallback("unthrottled")
    assert Fallback.parse("fixed:10MiB/s") == Fallback("fixed", 10 * MiB)
    assert Fallback.parse(" fixed: 1.5 GB/s ").fixed_rate == 1.5e9
    assert Fallback.parse("fixed:4096").fixed_rate == 4096
    assert str(Fallback.parse("fixed:10MiB/s")) == "fixed:10.00 MiB/s"
    assert Fallback.parse("keep-last:4MiB/s") == Fallback("keep-last", share_cap=4 * MiB)
    assert str(Fallback.parse("keep-last:4MiB/s")) == "keep-last:4.00 MiB/s"
    assert str(Fallback.parse("keep-last")) == "keep-last"


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "keep",
        "fixed",
        "fixed:",
        "fixed:fast",
        "fixed:0",
        "fixed:-1MiB/s",
        "ulimited",
        "keep-last:",
        "keep-last:0",
        "keep-last:inf",
    ],
)
def test_bad_fallback_specs_say_what_is_allowed(spec: str) -> None:
    with pytest.raises(ValueError, match="fallback"):
        Fallback.parse(spec)


def test_fallback_rates() -> None:
    keep_last = Fallback.parse("keep-last")
    assert keep_last.rate(3.0) == 3.0
    # Never more than the last live share: an allotted 0 is kept...
    assert keep_last.rate(0.0) == 0.0
    # ...and a session never allotted anything waits at 0: no per-session constant.
    assert keep_last.rate(None) == 0.0
    assert Fallback.parse("keep-last:2MiB/s").rate(None) == 0.0
    # After the grace: the lower of the kept rate and the budget share for a lease, then the
    # share (a kept 0 is lifted to it, a higher rate falls to it).
    assert keep_last.steps_after_grace(0.0, 5.0) == (0.0, 5.0)
    assert keep_last.steps_after_grace(8 * MiB, 5.0) == (5.0, 5.0)
    assert keep_last.steps_after_grace(3.0, 5.0) == (3.0, 5.0)
    # keep-last:<rate> caps the share (1 MiB/s by default); no budget (an old controller)
    # ends at 0.
    assert Fallback.parse("keep-last:4").steps_after_grace(8.0, 5.0) == (4.0, 4.0)
    assert keep_last.steps_after_grace(8 * MiB, 4 * MiB) == (MiB, MiB)
    assert keep_last.steps_after_grace(3.0, 0.0) == (0.0, 0.0)
    # Never admitted: 0 through the grace, then the conservative rate (never unthrottled).
    assert keep_last.steps_after_grace(None, 5.0) == (MiB, MiB)
    assert Fallback.parse("keep-last:2MiB/s").steps_after_grace(None, 5.0) == (2 * MiB, 2 * MiB)
    assert Fallback.parse("fixed:1KiB/s").rate(3.0) == 1024
    assert Fallback.parse("fixed:1KiB/s").rate(None) == 1024
    assert Fallback.parse("fixed:1KiB/s").steps_after_grace(0.0, 5.0) is None
    assert Fallback.parse("unthrottled").rate(3.0) == math.inf


# -------------------------------------------------------------------------- kinds, sizes


def test_kinds_map_to_the_wire_enum() -> None:
    assert op_kind("read") == pb.OP_KIND_READ
    assert op_kind("write") == pb.OP_KIND_WRITE
    assert op_kind("metadata") == pb.OP_KIND_METADATA


@pytest.mark.parametrize("kind", ["READ", "append", "", None, 1])
def test_unknown_kinds_are_rejected(kind: object) -> None:
    with pytest.raises(ValueError, match="kind"):
        op_kind(kind)  # type: ignore[arg-type]


def test_sizes() -> None:
    assert check_nbytes(0) == 0
    assert check_nbytes(10**15) == 10**15
    for bad in (-1, 1.0, "1", True, None):
        with pytest.raises(ValueError, match="nbytes"):
            check_nbytes(bad)  # type: ignore[arg-type]
    assert check_volume(2**53) == 2**53
    with pytest.raises(ValueError, match="volume"):
        check_volume(2**53 + 1)
    with pytest.raises(ValueError, match="volume"):
        check_volume(-1)


# -------------------------------------------------------------------------- options


def build(**overrides: object) -> SessionOptions:
    values: dict[str, object] = {
        "report_interval": 0.25,
        "quiet_gap": 0.1,
        "attach_timeout": 2.0,
        "client_id": None,
    }
    values.update(overrides)
    target = values.pop("target", "127.0.0.1:1")
    fallback = values.pop("fallback", "keep-last")
    return SessionOptions.build(target, JOB, fallback, **values)  # type: ignore[arg-type]


def test_options_defaults() -> None:
    options = build()
    assert options.fallback == Fallback("keep-last")
    host, pid, suffix = options.client_id.rsplit(":", 2)
    assert host == options.host and pid.isdigit() and len(suffix) == 8
    assert build().client_id != options.client_id


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"target": ""}, "target"),
        ({"fallback": "never"}, "fallback"),
        ({"report_interval": 0}, "report_interval"),
        ({"report_interval": math.inf}, "report_interval"),
        ({"quiet_gap": -0.1}, "quiet_gap"),
        ({"attach_timeout": math.nan}, "attach_timeout"),
        ({"client_id": ""}, "client_id"),
        ({"fallback_grace": -1}, "fallback_grace"),
        ({"fallback_grace": math.nan}, "fallback_grace"),
        ({"rate_observer": 3}, "rate_observer"),
    ],
)
def test_bad_options_are_named(overrides: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build(**overrides)


def test_job_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BURSTCTL_JOB_ID", "env-job")
    options = SessionOptions.build(
        "127.0.0.1:1",
        None,
        "unthrottled",
        report_interval=1,
        quiet_gap=0,
        attach_timeout=math.inf,
        client_id="c",
    )
    assert options.job.job_id == "env-job"


# -------------------------------------------------------------------------- backoff


def test_backoff_grows_with_jitter_up_to_the_cap_and_resets() -> None:
    backoff = Backoff(initial=0.05, maximum=2.0, rng=random.Random(7))
    delays = [backoff.next_delay() for _ in range(12)]
    ceilings = [min(2.0, 0.05 * 2**i) for i in range(12)]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert max(delays) <= 2.0
    backoff.reset()
    assert backoff.next_delay() <= 0.05


def test_channel_security_is_checked_when_loaded(tmp_path: Path) -> None:
    from burstctl.common.channels import ChannelSecurity

    pem = tmp_path / "ca.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n")
    secret = tmp_path / "secret"
    secret.write_text("  tok3n\n")
    sec = ChannelSecurity.load(tls_ca=pem, secret_file=secret)
    assert sec.secret == "tok3n" and sec.call_metadata() == (("authorization", "Bearer tok3n"),)
    assert ChannelSecurity().plain and not sec.plain
    empty = tmp_path / "empty"
    empty.write_text("\n")
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    for kwargs, word in (
        ({"secret_file": empty}, "empty"),
        ({"secret_file": tmp_path / "absent"}, "cannot read"),
        ({"tls_ca": not_pem}, "not a PEM"),
        ({"tls_cert": pem, "tls_key": pem}, "needs tls_ca"),
        ({"tls_ca": pem, "tls_cert": pem}, "go together"),
        ({"secret": "a", "secret_file": secret}, "not both"),
    ):
        with pytest.raises(ValueError, match=word):
            ChannelSecurity.load(**kwargs)  # type: ignore[arg-type]
