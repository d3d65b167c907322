"""OpenAI-compatible proxy over a memt_core server: latent memory for unchanged OpenAI SDK apps.

Routes: ``POST /v1/chat/completions``, ``GET /v1/models``, and session admin under
``/v1/memt/sessions/{id}``. Run it with ``python -m memt_proxy --upstream URL``.
"""

from memt_proxy.errors import ProxyError
from memt_proxy.chat.service import ChatService
from memt_proxy.session.sessions import Sessions

__all__ = ["ChatService", "ProxyError", "Sessions"]
