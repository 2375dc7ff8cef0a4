"""deploy/prometheus/ and deploy/grafana/ on the real thing (docs/monitoring.md).

promtool checks the rule files and the scrape configuration and runs the rules' unit tests
(deploy/prometheus/tests/); every alert is unit-tested firing and not firing, and documented.
Then a Prometheus server (Debian's package: deploy/system-deps.sh), configured from the
shipped prometheus.yml with both rule files loaded, scrapes two ``burstctl controller``
processes that are each other's peers while sessions move bytes, one of them with bytes on
the burst buffer and a job bound to each kind of rule; every query of the board, its
variables substituted as Grafana would, must return data from that Prometheus.

Without the ``prometheus`` and ``promtool`` binaries these tests are skipped, except on CI
(``CI`` set), where that is a failure.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from support import ControllerProcess, Pump, free_port, wait_until

from burstctl.client import JobInfo, Session

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
CONFIG = PROMETHEUS / "prometheus.yml"
RULE_FILES = sorted(PROMETHEUS.glob("burstctl-*.yml"))
UNIT_TESTS = sorted((PROMETHEUS / "tests").glob("*.yml"))
BOARD = ROOT / "deploy" / "grafana" / "burstctl.json"
DOC = ROOT / "docs" / "monitoring.md"
MiB = 1 << 20
# Grafana's own variables, as it would set them for a short range and a fast scrape.
BUILT_IN = {"__rate_interval": "5s", "__interval": "1s", "__range": "15s"}
# The operators' rules the test adds (docs/rest.md, /v1/rules): one job under each.
RULES = (
    {"name": "u-cap", "match": {"user": "u"}, "limit": 10 * MiB},
    {"name": "beta-min", "match": {"job": "beta"}, "reservation": 10 * MiB},
)


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is missing on CI (deploy/system-deps.sh installs it)")
        pytest.skip(f"{name} is not installed here (deploy/system-deps.sh installs it)")
    return path


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary("promtool"), *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def alert_names() -> list[str]:
    return [
        rule["alert"]
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]


def test_promtool_checks_the_rules_and_the_configuration() -> None:
    assert [p.name for p in RULE_FILES] == ["burstctl-alerts.yml", "burstctl-recording.yml"]
    checked = promtool("check", "rules", *RULE_FILES)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # the configuration names the rule files next to it: checked with it
    checked = promtool("check", "config", CONFIG)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_promtool_unit_tests_pass() -> None:
    assert UNIT_TESTS
    tested = promtool("test", "rules", *UNIT_TESTS)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_is_unit_tested_firing_and_not_firing() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for path in UNIT_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    names = set(alert_names())
    assert len(names) >= 10
    assert names - firing == set(), "never tested firing"
    assert names - silent == set(), "never tested silent"
    assert (firing | silent) - names == set(), "tests of alerts that do not exist"


def test_every_alert_is_documented_where_its_runbook_points() -> None:
    headings = re.findall(r"^### (Burstctl\w+)$", DOC.read_text(), re.M)
    assert sorted(headings) == sorted(alert_names())
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    anchor = f"docs/monitoring.md#{rule['alert'].lower()}"
                    assert rule["annotations"]["runbook"] == anchor
                    assert rule["labels"]["severity"] in {"critical", "warning", "info"}


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row holds its panels


def board_queries(board: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """Every query of the board by "panel [refId]": (the PromQL, its variables substituted
    as Grafana would with every replica selected; whether Grafana asks it as an instant
    query)."""
    values = dict(BUILT_IN)
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            values[var["name"]] = var["allValue"]

    def substitute(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        assert name in values, f"a variable the test does not know: {name}"
        return values[name]

    queries = {}
    for panel in panels(board):
        for target in panel.get("targets", []):
            expr = re.sub(r"\$\{(\w+)\}|\$(\w+)", substitute, target["expr"])
            queries[f"{panel['title']} [{target['refId']}]"] = (expr, bool(target.get("instant")))
    return queries


def test_the_board_reads_its_data_source_from_a_variable() -> None:
    board = json.loads(BOARD.read_text())
    source = {"type": "prometheus", "uid": "${datasource}"}
    var = board["templating"]["list"][0]
    assert (var["name"], var["type"], var["query"]) == ("datasource", "datasource", "prometheus")
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids))
    for panel in panels(board):
        if panel["type"] != "row":
            assert panel["datasource"] == source, panel["title"]
            assert panel["targets"], panel["title"]
            assert all(t["datasource"] == source for t in panel["targets"]), panel["title"]
    assert len(board_queries(board)) >= 30


class PrometheusServer:
    """A ``prometheus`` child process on a loopback port, its data in ``workdir``, set up
    from the shipped prometheus.yml: scraping ``targets`` every 0.5 s (the scrape job and
    its labels as shipped), the rule files loaded. Stopped by pid."""

    def __init__(self, workdir: Path, targets: list[str]) -> None:
        config = yaml.safe_load(CONFIG.read_text())
        config["global"] = {"scrape_interval": "500ms", "evaluation_interval": "500ms"}
        config["rule_files"] = [str(p) for p in RULE_FILES]
        (job,) = config["scrape_configs"]
        job["static_configs"] = [{"targets": targets}]
        workdir.mkdir()
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config))
        self.data = workdir / "data"
        self.log = workdir / "prometheus.log"
        self.url = f"http://127.0.0.1:{free_port()}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> PrometheusServer:
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    binary("prometheus"),
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.data}",
                    f"--web.listen-address={self.url.removeprefix('http://')}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_until(self.ready, 30, 0.1, "Prometheus to be ready")
        return self

    def ready(self) -> bool:
        assert self.proc is not None
        assert self.proc.poll() is None, "prometheus exited:\n" + self.log.read_text()[-3000:]
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def api(self, path: str, **params: str | float) -> Any:
        answer = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        assert answer.status_code == 200, (path, params, answer.text)
        return answer.json()["data"]

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def has_data(prometheus: PrometheusServer, expr: str, instant: bool) -> bool:
    """Whether the query returns a series with a number, now or over the last 15 s."""
    now = time.time()
    if instant:
        result = prometheus.api("query", query=expr, time=now)["result"]
        values = [s["value"] for s in result]
    else:
        result = prometheus.api("query_range", query=expr, start=now - 15, end=now, step=1)[
            "result"
        ]
        values = [v for s in result for v in s["values"]]
    return any(math.isfinite(float(v)) for _, v in values)


def add_rules(ctl: ControllerProcess) -> None:
    token = (ctl.state_dir / "admin-token").read_text().strip()
    for rule in RULES:
        answer = httpx.post(
            f"{ctl.url}/v1/rules",
            json=rule,
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
        assert answer.status_code == 201, answer.text


def test_prometheus_scraping_two_replicas_answers_every_query_of_the_board(
    controller_factory: Any, tmp_path: Path
) -> None:
    binary("prometheus")
    ports = [free_port(), free_port()]
    common = ["--node-bandwidth", "1GiB/s", "--sync-interval", "0.2"]
    r1 = controller_factory(
        *common,
        *("--replica-id", "r1", "--capacity", "40MiB/s", "--bb-capacity", "1GiB"),
        *("--peers", f"127.0.0.1:{ports[1]}"),
        address=f"127.0.0.1:{ports[0]}",
    )
    r2 = controller_factory(
        *common,
        *("--replica-id", "r2", "--capacity", "20MiB/s"),
        *("--peers", f"127.0.0.1:{ports[0]}"),
        address=f"127.0.0.1:{ports[1]}",
    )
    queries = board_queries(json.loads(BOARD.read_text()))
    add_rules(r1)
    jobs = {  # job: (replica, user); alpha under u-cap, beta under beta-min
        "alpha": (r1, "u"),
        "beta": (r1, "v"),
        "gamma": (r2, "w"),
    }
    pumps: list[Pump] = []
    with ExitStack() as stack:

        def start(name: str) -> Session:
            ctl, user = jobs[name]
            session = Session(ctl.address, JobInfo(name, user, "hpc"), buffer=name == "beta")
            stack.enter_context(session)
            pumps.append(Pump(session).start())
            stack.callback(pumps[-1].stop)  # before the session closes
            return session

        first = [start("alpha"), start("beta")]
        first[1].report_buffer(64 * MiB, 32 * MiB)
        # Flowing before Prometheus starts: r1's every sample then has it saturated.
        wait_until(
            lambda: all(s.attached and s.rate > 0 for s in first),
            15,
            message="alpha and beta flowing",
        )
        assert r1.url is not None and r2.url is not None
        prometheus = stack.enter_context(
            PrometheusServer(tmp_path / "prometheus", [r1.url[7:], r2.url[7:]])
        )
        # A job that starts once Prometheus has scraped both replicas: r2 decides for it,
        # and the decision latency (over the decisions of its window) has something to show.
        wait_until(
            lambda: len(prometheus.api("query", query='up{job="burstctl"} == 1')["result"]) == 2,
            15,
            0.1,
            "Prometheus to scrape both replicas",
        )
        start("gamma")

        empty: list[str] = []

        def every_query_has_data() -> bool:
            empty[:] = [k for k, (q, i) in queries.items() if not has_data(prometheus, q, i)]
            return not empty

        try:
            wait_until(every_query_has_data, 30, 0.5, "data for every query of the board")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; no data for: {empty}") from None

        # Every rule evaluates without error. Alerts on live data: r1, saturated since the
        # first scrape, and u-cap, whose limit holds alpha back, have theirs pending.
        def evaluated() -> list[dict[str, Any]] | None:
            rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
            return None if any(r["health"] == "unknown" for r in rules) else rules

        rules = wait_until(evaluated, 10, 0.2, "every rule evaluated once")
        assert isinstance(rules, list)
        assert len(rules) == sum(
            len(g["rules"]) for p in RULE_FILES for g in yaml.safe_load(p.read_text())["groups"]
        )
        assert [(r["name"], r["lastError"]) for r in rules if r["health"] != "ok"] == []
        expected = {("BurstctlCapacitySaturated", "r1"), ("BurstctlRuleLimitBinding", "u-cap")}
        raised: set[tuple[str, str]] = set()

        def pending() -> bool:
            raised.clear()
            for alert in prometheus.api("alerts")["alerts"]:
                labels = alert["labels"]
                raised.add((labels["alertname"], labels.get("replica") or labels.get("rule")))
            return expected <= raised

        try:
            wait_until(pending, 10, 0.2, "the alerts of r1 and u-cap")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; raised: {sorted(raised)}") from None
    assert not any(p.errors for p in pumps)
