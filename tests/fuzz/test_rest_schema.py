"""schemathesis over the OpenAPI schema of a live controller's REST API.

The schema is the one the controller serves (``/openapi.json``) and the requests go to
that controller over HTTP, with the admin bearer token, with a wrong one and without one.
Whatever schemathesis generates from the schema (valid and invalid bodies, paths and
headers), the controller never answers 5xx, every response of a documented status
conforms to the schema (body, content type, headers), invalid data is refused and a
request without the token is refused where the schema asks for it.

Not checked here, on purpose: ``positive_data_acceptance`` (a policy ``name`` is a string
in the schema but must be a registered name or a sharing spec, refused with a 422 naming
``name`` otherwise, docs/rest.md). Also checked: every status the API answers is
documented (401/403 of the token check, 404, 503, the 200 of a re-registration), and
with reads open (the default) the schema does not claim they need the token.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from fuzz_support import FUZZ_ENV, FUZZ_PROFILE
from hypothesis import HealthCheck, given, settings
from schemathesis import checks
from schemathesis.checks import CheckFunction
from support import ControllerProcess

pytestmark = pytest.mark.integration

TOKEN = "fuzz-admin-token"
AUTH = {
    "token": {"Authorization": f"Bearer {TOKEN}"},
    "wrong-token": {"Authorization": "Bearer not-the-token"},
    "no-token": {},
}


def start_controller(base: Path, protect_reads: bool) -> ControllerProcess:
    token_file = base / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    return ControllerProcess(
        base / "state",
        ["--admin-token-file", str(token_file)],
        env={**FUZZ_ENV, "BURSTCTL_PROTECT_READS": "true" if protect_reads else "false"},
    ).start()


@pytest.fixture(scope="module")
def rest_controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProcess]:
    """Reads need the token too, as the schema says of every route but the health checks."""
    proc = start_controller(tmp_path_factory.mktemp("rest-fuzz"), protect_reads=True)
    try:
        yield proc
    finally:
        proc.stop()


def fuzz_api(
    controller: ControllerProcess,
    headers: dict[str, str],
    checks: list[CheckFunction],
    max_examples: int | None = None,
) -> list[str]:
    """Runs every operation of the controller's schema through ``checks``, at most
    ``max_examples`` cases each (default: the fuzz profile's); their labels."""
    assert controller.url is not None
    schema = schemathesis.openapi.from_url(f"{controller.url}/openapi.json")
    labels = []
    for result in schema.get_all_operations():
        operation = result.ok()
        labels.append(operation.label)

        @settings(
            settings.get_profile(FUZZ_PROFILE),
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            **({} if max_examples is None else {"max_examples": max_examples}),
        )
        @given(case=operation.as_strategy())
        def check(case: schemathesis.Case) -> None:
            response = case.call(headers=headers)
            assert response.status_code < 500, (case.method, case.path, response.text[:500])
            case.validate_response(response, checks=checks)

        check()
        assert controller.proc is not None and controller.proc.poll() is None, controller.log
    return labels


CONFORMANCE: list[CheckFunction] = [
    checks.not_a_server_error,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
    checks.negative_data_rejection,
    checks.ignored_auth,
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("auth", list(AUTH))
def test_rest_api_never_5xx_and_conforms(rest_controller: ControllerProcess, auth: str) -> None:
    # Without the token every route but the health checks is refused before its body is
    # read: a few cases per route show that (and no 5xx); the bodies get the token's run.
    refused = auth != "token" and FUZZ_PROFILE != "fuzz-long"
    labels = fuzz_api(rest_controller, AUTH[auth], CONFORMANCE, 8 if refused else None)
    # The API the schema describes: policies, jobs, replicas, metrics, health.
    assert {"PUT /v1/policy", "POST /v1/jobs", "GET /metrics"} <= set(labels), labels


@pytest.mark.timeout(120)
def test_rest_api_documents_every_status(rest_controller: ControllerProcess) -> None:
    fuzz_api(rest_controller, AUTH["no-token"], [checks.status_code_conformance])


@pytest.mark.timeout(120)
def test_rest_api_schema_says_reads_are_open_by_default(tmp_path: Path) -> None:
    proc = start_controller(tmp_path, protect_reads=False)
    try:
        fuzz_api(proc, AUTH["no-token"], [checks.ignored_auth])
    finally:
        proc.stop()


# What the long profile found (issue 15 finding 2, a name with a colon reached an import):
# each must be a 422
# of the documented shape (a list of errors) naming `name`, and the policy must not change.
IMPORT_PATHS = [":x", "..:x", ".:x", "this:x", "burstctl.policies.base:Policy"]


@pytest.mark.timeout(60)
def test_policy_name_that_is_an_import_path_gets_the_documented_422(tmp_path: Path) -> None:
    proc = start_controller(tmp_path, protect_reads=False)
    try:
        assert proc.url is not None
        with httpx.Client(base_url=proc.url, headers=AUTH["token"], timeout=10) as http:
            before = http.get("/v1/policy").json()
            problems = []
            for name in IMPORT_PATHS:
                try:
                    r = http.put("/v1/policy", json={"name": name})
                except httpx.HTTPError as exc:  # the server dropped the connection
                    problems.append(f"{name!r}: {exc!r}")
                    continue
                detail = r.json().get("detail") if r.status_code < 500 else r.text
                if not (
                    r.status_code == 422
                    and isinstance(detail, list)
                    and any(e.get("loc") == ["body", "name"] for e in detail)
                ):
                    problems.append(f"{name!r}: {r.status_code} {detail!r}"[:200])
            assert not problems, problems
            assert http.get("/v1/policy").json() == before
    finally:
        proc.stop()
