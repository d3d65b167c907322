"""``--help`` that states each option's default once, for the launchers of both servers."""

from __future__ import annotations

import argparse
import re


class DefaultsOnce(argparse.ArgumentDefaultsHelpFormatter):
    """Adds "(default: …)" to an option's help unless the help already says its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        return action.help if re.search(r"\bdefault\b", action.help or "") else super()._get_help_string(action)
