"""Live-server fixtures (see ``servers.py``): ``nano_server``, ``flash_server``, ``memt_servers``;
and the OpenAI-compatible proxy's (see ``proxies.py``): ``proxy_upstream``, ``proxy``, ``fresh_proxy``, ``proxy_chat_format``, ``long_seed``, ``demo_proxy``."""

from e2e.proxies import demo_proxy, fresh_proxy, long_seed, proxy, proxy_chat_format, proxy_upstream  # noqa: F401  (pytest fixtures)
from e2e.servers import flash_server, memt_servers, nano_server  # noqa: F401  (pytest fixtures)
