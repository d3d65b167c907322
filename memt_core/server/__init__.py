"""The native memt-http-v1 HTTP server: FastAPI routes over ``MemTService``."""

from memt_core.server.app import create_app
from memt_core.server.service import MemTService

__all__ = ["MemTService", "create_app"]
