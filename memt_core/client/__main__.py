"""``python -m memt_core.client``: the interactive chat client (see ``memt_core.client.cli``)."""

import sys

from memt_core.client.cli import main

if __name__ == "__main__":
    sys.exit(main())
