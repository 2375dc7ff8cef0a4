"""Configuration: defaults, TOML, environment, flags, and errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from burstctl.common.units import format_rate, parse_rate
from burstctl.controller.config import ConfigError, load_config

MiB = float(1 << 20)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("BURSTCTL_"):
            monkeypatch.delenv(key)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("400MiB/s", 400 * MiB),
        ("1GiB/s", 1024 * MiB),
        ("10KiB/s", 10240.0),
        ("1.5GB/s", 1.5e9),
        ("10MB/s", 1e7),
        ("10KB/s", 1e4),
        ("100B/s", 100.0),
        ("40 MiB/s", 40 * MiB),
        (1000, 1000.0),
    ],
)
def test_parse_rate(text: str | int, value: float) -> None:
    assert parse_rate(text) == value


@pytest.mark.parametrize("text", ["fast", "-1MiB/s", "inf", "nan", "10 parsecs/s", ""])
def test_parse_rate_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="rate"):
        parse_rate(text)


def test_format_rate() -> None:
    assert format_rate(40 * MiB) == "40.00 MiB/s"


def test_embedded_defaults() -> None:
    c = load_config()
    assert c.grpc_listen == "127.0.0.1:50051" and c.http_listen == "127.0.0.1:8080"
    assert c.policy == "fair-share" and c.capacity == 1024 * MiB


def test_precedence_flags_over_env_over_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = tmp_path / "c.toml"
    f.write_text('capacity = "10MiB/s"\npolicy = "fcfs"\nnode_bandwidth = "1MiB/s"\n')
    c = load_config(f)
    assert (c.capacity, c.policy, c.node_bandwidth) == (10 * MiB, "fcfs", MiB)
    monkeypatch.setenv("BURSTCTL_CAPACITY", "20MiB/s")
    assert load_config(f).capacity == 20 * MiB
    assert load_config(f, capacity="30MiB/s").capacity == 30 * MiB
    assert load_config(f, capacity=None).capacity == 20 * MiB  # unset flag: no override


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"capacity": "lots"}, "capacity"),
        ({"grpc_listen": "nope"}, "grpc_listen"),
        ({"heartbeat_timeout": -1}, "heartbeat_timeout"),
        ({"log_level": "loud"}, "log_level"),
        ({"capacity": "0B/s"}, "capacity"),
    ],
)
def test_bad_values_name_the_field(overrides: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        load_config(**overrides)


def test_unknown_key_in_file(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('capacity = "10MiB/s"\ncapasity = "1GiB/s"\n')
    with pytest.raises(ConfigError, match="capasity"):
        load_config(f)


def test_missing_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "absent.toml")
    f = tmp_path / "broken.toml"
    f.write_text("capacity = [\n")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(f)


def test_every_key_is_documented_and_the_example_loads() -> None:
    root = Path(__file__).resolve().parents[3]
    doc = (root / "docs" / "configuration.md").read_text()
    from burstctl.controller.config import ControllerConfig

    missing = [k for k in ControllerConfig.model_fields if f"| `{k}` |" not in doc]
    assert not missing, f"undocumented keys in docs/configuration.md: {missing}"
    example = load_config(root / "deploy" / "examples" / "controller.toml")
    assert example.capacity == 400 * MiB and example.replica_id == "bb01"


def test_peer_settings_from_flags_env_and_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    defaults = load_config()
    assert (defaults.peers, defaults.sync_interval, defaults.missed_exchanges) == ([], 0.5, 3)
    flags = load_config(peers="10.0.0.2:50051,[::1]:7000", sync_interval=0.2, missed_exchanges=5)
    assert flags.peers == ["10.0.0.2:50051", "[::1]:7000"]
    assert (flags.sync_interval, flags.missed_exchanges) == (0.2, 5)
    monkeypatch.setenv("BURSTCTL_PEERS", "a:1, b:2")
    assert load_config().peers == ["a:1", "b:2"]
    monkeypatch.delenv("BURSTCTL_PEERS")
    f = tmp_path / "c.toml"
    f.write_text('peers = ["h1:50051", "h2:50051"]\nsync_interval = 1.5\nmissed_exchanges = 2\n')
    cfg = load_config(f)
    assert cfg.peers == ["h1:50051", "h2:50051"]
    assert (cfg.sync_interval, cfg.missed_exchanges) == (1.5, 2)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"peers": "nohost"}, "peers"),
        ({"peers": "h:0"}, "peers"),
        ({"peers": "h:1,h:1"}, "peers"),
        ({"sync_interval": 0}, "sync_interval"),
        ({"missed_exchanges": 0}, "missed_exchanges"),
    ],
)
def test_bad_peer_settings_name_the_field(overrides: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        load_config(**overrides)


@pytest.mark.parametrize("setup", ["two", "three"])
def test_replica_examples_load_and_name_each_other_as_peers(setup: str) -> None:
    root = Path(__file__).resolve().parents[3] / "deploy" / "replicas" / setup
    configs = [load_config(path) for path in sorted(root.glob("r*.toml"))]
    assert len(configs) == {"two": 2, "three": 3}[setup]
    listen = {c.grpc_listen for c in configs}
    assert len(listen) == len(configs)  # distinct ports
    assert len({c.http_listen for c in configs}) == len(configs)
    assert len({c.replica_id for c in configs}) == len(configs)
    assert len({c.state_dir for c in configs}) == len(configs)
    assert len({c.capacity for c in configs}) == len(configs)  # different capacities
    for c in configs:
        assert set(c.peers) == listen - {c.grpc_listen}
