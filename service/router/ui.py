"""The live page at ``/ui``: static files shipped in the package (``ui/``), no CDN and no
build step. The page polls the router's own JSON API; the fast path never sees these
requests (they are not under /v1/state/).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles

__all__ = ["UI_DIR", "mount_ui"]

UI_DIR = Path(__file__).with_name("ui")


def mount_ui(app: FastAPI) -> None:
    """/ui/ serves index.html (/ui redirects there, so the page's relative links resolve)."""
    app.mount("/ui", StaticFiles(directory=UI_DIR, html=True), name="ui")
