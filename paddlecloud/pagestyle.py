"""The one stylesheet of paddlecloud's pages: the master's job page and the job server's
overview (and the job pages it proxies) share it, so it lives below both."""

from __future__ import annotations

import importlib.resources

MEDIA_TYPE = "text/css"
CACHE_CONTROL = "max-age=300"  # no job data in it


def stylesheet() -> str:
    return (importlib.resources.files("paddlecloud") / "static" / "page.css").read_text(encoding="utf-8")
