"""The FastAPI application: routers, configuration, store and cluster in `app.state`.

`/openapi.json` is served by the app itself; `/docs` is FastAPI's Swagger UI, whose
scripts come from a CDN (jsDelivr): air-gapped clusters use `/openapi.json` with a
local viewer instead (docs/job-server.md).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI

from job_server.cluster import Cluster
from job_server.config import ServerConfig
from job_server.packages import PackageStore
from job_server.routers import jobs, packages, version

logger = logging.getLogger(__name__)


def create_app(config: ServerConfig, *, api_client: Any) -> FastAPI:
    """The server, talking to the cluster through `api_client` (a kubernetes ApiClient)."""
    app = FastAPI(title="paddlecloud Job Server", version="1",
                  description="Upload trainer packages and run paddlecloud jobs (DESIGN.md §11).")
    app.state.config = config
    app.state.store = PackageStore(config.store)
    app.state.cluster = Cluster(api_client, build=config.build, paddlejobs=config.paddlejobs)
    for router in (packages.router, jobs.router, version.router):
        app.include_router(router)
    return app
