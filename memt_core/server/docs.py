"""Interactive API docs that work offline: Swagger UI's files come from the ``swagger-ui-bundle`` package.

FastAPI's default ``/docs`` page loads Swagger UI from a CDN, so it is blank on a machine without
internet. ``offline_docs`` serves the same page with the scripts and styles from the installed package.
Shared by the native server and the proxy.
"""

from __future__ import annotations

from typing import Sequence

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.params import Depends
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs-assets"


def mount_assets(app: FastAPI) -> None:
    """Serve Swagger UI's scripts and styles under ``/docs-assets`` (static files, no key needed)."""
    from swagger_ui_bundle import swagger_ui_path

    app.mount(ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")


def swagger_page(openapi_url: str, title: str):
    """The docs page, loading Swagger UI from ``mount_assets``' route instead of a CDN."""
    return get_swagger_ui_html(
        openapi_url=openapi_url, title=f"{title} — API docs",
        swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js", swagger_css_url=f"{ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
    )


def offline_docs(app: FastAPI, *, title: str, dependencies: Sequence[Depends] = ()) -> None:
    """Serve ``/docs`` (and its assets) for ``app``, whose own ``docs_url`` must be None."""
    mount_assets(app)

    @app.get("/docs", include_in_schema=False, dependencies=list(dependencies))
    async def docs():
        return swagger_page(app.openapi_url, title)
