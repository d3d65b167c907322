"""The one worker thread that prepares a large request (templating, tokenizing, hashing) off the event loop.

One thread for every surface and the session layer: tokenizers and templates are used from one worker at a time.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor

#: requests with more text than this are templated and tokenized in a worker thread, off the event loop
OFF_LOOP_CHARS = 64 * 1024
_WORKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memt-prepare")


async def off_loop(size: int, work, *args, **kwargs):
    """``work(*args, **kwargs)``: in the worker thread when the request (``size`` characters of JSON) is large,
    so that preparing it slows only itself, never ``/health`` or the other requests."""
    if size <= OFF_LOOP_CHARS:
        return work(*args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_WORKER, functools.partial(work, *args, **kwargs))
