"""The Job Server against its own OpenAPI document (schemathesis): no 5xx for any request."""

from __future__ import annotations

import asyncio
from typing import Any

import hypothesis
import schemathesis
from hypothesis import HealthCheck, settings

from job_server.app import create_app
from job_server.config import Limits, Quotas, ServerConfig

AUTH = {"Authorization": "Bearer token-a"}


def check_operations(app: Any) -> list[str]:
    """Generated requests for every operation; returns the operations checked."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    checked = []
    for result in schema.get_all_operations():
        operation = result.ok()

        @settings(max_examples=25, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @hypothesis.given(case=operation.as_strategy())
        def no_server_error(case: Any) -> None:
            response = case.call(headers=AUTH)
            assert response.status_code < 500, (case.method, case.formatted_path, response.text)

        no_server_error()
        checked.append(f"{operation.method.upper()} {operation.path}")
    return checked


async def test_no_generated_request_gets_a_server_error(k8s, api_client, tmp_path):
    config = ServerConfig(store=str(tmp_path / "store"), tokens={"token-a": ("team-a", "default")},
                          limits=Limits(max_upload_bytes=100_000), quotas=Quotas(max_gpus_per_job=8))
    app = create_app(config, api_client=api_client)
    checked = await asyncio.to_thread(check_operations, app)
    assert sorted(checked) == ["DELETE /v1/jobs/{name}", "GET /v1/jobs", "GET /v1/jobs/{name}",
                               "GET /v1/jobs/{name}/logs", "GET /v1/version", "POST /v1/package", "POST /v1/trainer/job"]
