"""Files shipped inside the package: the trained tiny demo checkpoint."""

from pathlib import Path

#: The trained demo checkpoint (what the launcher serves when no ``--model-path`` is given).
BUNDLED_MODEL = Path(__file__).resolve().parent / "memt-tiny-demo"
