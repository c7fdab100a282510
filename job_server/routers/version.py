"""`GET /v1/version`: the server's version (no token needed)."""

from __future__ import annotations

import logging
from importlib.metadata import PackageNotFoundError, version

from fastapi import APIRouter

from job_server.models import Version

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/v1", tags=["version"])


@router.get("/version", response_model=Version)
def get_version() -> Version:
    try:
        number = version("paddlecloud")
    except PackageNotFoundError:
        number = "unknown"
    return Version(version=number)
