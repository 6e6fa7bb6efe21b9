"""Schemathesis fuzzes every operation of the app's own OpenAPI schema against a real server: no input,
valid by the schema or not, with or without keys, gets a 5xx, and every error has OpenAI's shape.
Bounded: ~100 examples in all (a few per operation and generation mode); then (slow) the schemathesis
CLI with every check and a few hundred examples per operation, 0 failures (issue 27)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from teamtr.serving.server import ServeConfig
from tests.support.serving import make_run_dir, serve_in_background

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is not installed (dev extra)")
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402

API_KEY, ADMIN_KEY = "sk-fuzz", "admin-fuzz"
EXAMPLES_PER_OPERATION_AND_MODE = 6
CHAT = "POST /v1/chat/completions"


@pytest.fixture(scope="module")
def fuzz_server(tiny_model_dir, tmp_path_factory):
    run = make_run_dir(tiny_model_dir, tmp_path_factory.mktemp("run"), versions=1)
    config = ServeConfig.from_run_dir(run, "chain", api_keys=[API_KEY], admin_key=ADMIN_KEY)
    with serve_in_background(config) as server:
        yield server


def _fuzz(operation, mode, url: str, seen: dict[int, int], ran_team: list) -> None:
    """Up to EXAMPLES_PER_OPERATION_AND_MODE generated calls of one operation; any 5xx fails."""
    label = operation.label

    @settings(
        max_examples=EXAMPLES_PER_OPERATION_AND_MODE,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def call(case):
        # alternate: the admin key opens every endpoint; otherwise whatever the case carries
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"} if len(seen) % 2 == 0 else None
        if label == CHAT and isinstance(case.body, dict) and len(seen) % 2 == 0:
            # also reach the team with the other generated fields (seed, stream, metadata, ...)
            case.body["model"] = "chain"
            history = case.body.get("messages") if isinstance(case.body.get("messages"), list) else []
            case.body["messages"] = [*history[:3], {"role": "user", "content": "1+2+3"}]
        response = case.call_and_validate(
            base_url=url, headers=headers, checks=[not_a_server_error], timeout=60
        )
        seen[len(seen)] = response.status_code
        if label == CHAT and response.status_code == 200:
            ran_team.append(case.body)
        assert response.status_code < 500
        if response.status_code >= 400:
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}

    try:
        call()
    except Unsatisfiable:  # nothing to make invalid (e.g. GET /health has no inputs)
        assert mode == GenerationMode.NEGATIVE


def test_no_input_gets_a_server_error(fuzz_server):
    schema = schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.label for op in operations} >= {CHAT, "POST /admin/adapters", "GET /v1/models"}
    seen: dict[int, int] = {}
    ran_team: list = []
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _fuzz(operation, mode, fuzz_server.url, seen, ran_team)
    assert len(seen) >= 2 * len(operations)
    assert any(400 <= s < 500 for s in seen.values()) and any(s == 200 for s in seen.values())
    assert ran_team, "no generated request reached the team"
    assert httpx.get(fuzz_server.url + "/health").status_code == 200  # still serving


# the request fields for sampling (honoured or refused), deadlines and streaming options, each drawn from
# valid values, wrong types and edge values alike
ANY_JSON = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.lists(st.text(max_size=4), max_size=5),
    st.dictionaries(st.text(max_size=8), st.booleans(), max_size=2),
)
NEW_FIELDS = {
    "temperature": st.one_of(st.floats(-1, 3), ANY_JSON),
    "top_p": st.one_of(st.floats(-0.5, 1.5), ANY_JSON),
    "max_tokens": st.one_of(st.integers(-2, 40), ANY_JSON),
    "max_completion_tokens": st.one_of(st.integers(-2, 40), ANY_JSON),
    "stop": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=6), ANY_JSON),
    "seed": st.one_of(st.integers(-(2**64), 2**64), ANY_JSON),
    "n": st.one_of(st.integers(-1, 12), ANY_JSON),
    "timeout": st.one_of(st.floats(-1, 1e9), ANY_JSON),
    "stream": st.one_of(st.booleans(), ANY_JSON),
    "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": ANY_JSON}), ANY_JSON),
}


def test_the_new_request_fields_never_get_a_server_error(fuzz_server):
    seen: list[int] = []

    @settings(
        max_examples=40,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(fields=st.fixed_dictionaries({}, optional=NEW_FIELDS))
    def call(fields):
        body = {"model": "chain", "messages": [{"role": "user", "content": "1+2+3"}], **fields}
        headers = {"Authorization": f"Bearer {API_KEY}"}
        with httpx.stream(
            "POST", fuzz_server.url + "/v1/chat/completions", json=body, headers=headers, timeout=60
        ) as r:
            r.read()
        seen.append(r.status_code)
        assert r.status_code < 500, (fields, r.text[:300])
        if r.status_code >= 400:
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        elif r.headers["content-type"].startswith("text/event-stream"):
            assert r.text.rstrip().endswith("data: [DONE]")
            assert '"server_error"' not in r.text, (fields, r.text[-300:])  # no crash reported in-band

    call()
    assert 200 in seen and any(400 <= s < 500 for s in seen)


# the business rules a JSON schema cannot say (the last message is the user's; a pushed directory must be
# a LoRA adapter the registry accepts) are 400s of these operations, valid by the schema or not
SCHEMATHESIS_CONFIG = """
[[operations]]
include-name = ["POST /v1/chat/completions", "POST /admin/adapters", "POST /admin/candidate"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409", "429"]
"""
EXAMPLES_PER_OPERATION = int(os.environ.get("TEAMTR_FUZZ_EXAMPLES", "200"))


@pytest.mark.slow
def test_schemathesis_with_every_check_finds_nothing(fuzz_server, tmp_path):
    """`st run --checks all` (status codes, response schemas, content types, auth, Allow headers,
    positive and negative data, stateful links), a few hundred examples per operation, bounded in time."""
    config = tmp_path / "schemathesis.toml"
    config.write_text(SCHEMATHESIS_CONFIG)
    command = [
        str(Path(sys.executable).parent / "st"),
        "--config-file", str(config),
        "--no-color",
        "run", fuzz_server.url + "/openapi.json",
        "--checks", "all",
        "--max-examples", str(EXAMPLES_PER_OPERATION),
        "--seed", "27",
        "--request-timeout", "60",
        "-H", f"Authorization: Bearer {ADMIN_KEY}",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=1500, cwd=tmp_path)  # its cache there
    assert done.returncode == 0, done.stdout[-6000:]
    assert " passed" in done.stdout and "failures" not in done.stdout.split("SUMMARY")[-1]
