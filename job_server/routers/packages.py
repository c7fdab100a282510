"""`POST /v1/package`: upload a trainer package (zip or tar.gz with requirements.txt)."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Depends, File, HTTPException, Request, UploadFile, status

from job_server.auth import Caller
from job_server.config import MULTIPART_SLACK
from job_server.models import PackageInfo
from job_server.packages import CHUNK, PackageError, unpack

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/v1", tags=["packages"])


def body_within_limit(request: Request) -> None:
    """413 before the body is read when its declared length is over the limit."""
    limit = request.app.state.config.limits.max_upload_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit + MULTIPART_SLACK:
        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE,
                            f"the upload is {declared} bytes; the limit (max_upload_bytes) is {limit}")


@router.post("/package", response_model=PackageInfo, status_code=status.HTTP_201_CREATED,
             dependencies=[Depends(body_within_limit)],
             responses={413: {"description": "Over max_upload_bytes, max_unpacked_bytes or max_files"},
                        422: {"description": "Refused: the message names the entry and the rule"}})
def upload_package(request: Request, caller: Caller,
                   file: Annotated[UploadFile, File(description="zip or tar.gz")]) -> PackageInfo:
    """Store a package (unpacked safely, by content hash: uploading it again is free)."""
    config = request.app.state.config
    limit = config.limits.max_upload_bytes
    data = bytearray()
    while chunk := file.file.read(CHUNK):
        data += chunk
        if len(data) > limit:
            raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE,
                                f"the upload is over the limit (max_upload_bytes) of {limit} bytes")
    warnings: list[str] = []
    try:
        files = unpack(data, filename=file.filename or "upload", limits=config.limits,
                       warn=warnings.append)
    except PackageError as error:
        raise HTTPException(error.status, str(error)) from None
    stored = request.app.state.store.put(files)
    logger.info("package %s: %d files, %s", stored.digest[:12], len(stored.files),
                "reused" if stored.reused else "stored")
    for warning in warnings:
        logger.info("package %s: %s", stored.digest[:12], warning)
    return PackageInfo(digest=stored.digest, files=list(stored.files), size=stored.size,
                       reused=stored.reused, warnings=warnings)
