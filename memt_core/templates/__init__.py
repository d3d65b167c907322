"""Prompt-format files shipped with the package: the Nano chat template and the Flash DSV4 encoder.

They are data for tiny checkpoints and the demo model (a real checkpoint brings its own).
"""

from importlib import resources


def template_text(name: str) -> str:
    """The text of a file in this package (e.g. ``nano_chat_template.jinja``)."""
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
