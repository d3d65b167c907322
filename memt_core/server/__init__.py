"""The native memt-http-v1 HTTP server: FastAPI routes (``app``) over ``MemTService`` (``service``).

Nothing is imported here, so the pieces the proxy shares (``docs``, ``slow_clients``) load without the
engine's dependencies (PyTorch).
"""
