"""Shared fixtures: one tiny random checkpoint of each family, built once per test session.

The checkpoint directories are shared by every test of the session: treat them as read-only and copy
one (``shutil.copytree``) before editing it. The loaded models are in eval mode and shared too;
tests must not change their parameters.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memt_core.families import FLASH, NANO, SMOL

# The tiny models gain nothing from intra-op threads, and on a small shared machine OpenMP threads
# spinning against other work make the suite several times slower. Set before torch is imported;
# an explicit OMP_NUM_THREADS in the environment wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def nano_checkpoint(tmp_path_factory) -> Path:
    """A tiny random MemT-1.0-Nano checkpoint (4 layers, memory on layers 1 and 3, chunk_tokens 32)."""
    from memt_core.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("nano"), NANO)


@pytest.fixture(scope="session")
def flash_checkpoint(tmp_path_factory) -> Path:
    """A tiny random MemT-1.0-Flash checkpoint (2 layers, both with memory, sliding window 64, chunk_tokens 32)."""
    from memt_core.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("flash"), FLASH)


@pytest.fixture(scope="session")
def smol_checkpoint(tmp_path_factory) -> Path:
    """A tiny random memt-smol checkpoint (a 4-layer Llama, memory on layers 2 and 3, chunk_tokens 32), every
    tensor in the directory (no external backbone)."""
    from memt_core.tiny import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("smol"), SMOL)


@pytest.fixture(scope="session")
def smol_model(smol_checkpoint):
    """The memt-smol checkpoint loaded in FP32 on CPU (shared: do not modify)."""
    from memt_core.models.weights import load_model

    return load_model(smol_checkpoint)


@pytest.fixture(scope="session")
def nano_model(nano_checkpoint):
    """The Nano checkpoint loaded in FP32 on CPU (shared: do not modify)."""
    from memt_core.models.weights import load_model

    return load_model(nano_checkpoint)


@pytest.fixture(scope="session")
def flash_model(flash_checkpoint):
    """The Flash checkpoint loaded in FP32 on CPU (shared: do not modify)."""
    from memt_core.models.weights import load_model

    return load_model(flash_checkpoint)


@pytest.fixture(params=[NANO, FLASH, SMOL])
def tiny_model(request):
    """Each family's loaded model in turn."""
    return request.getfixturevalue({NANO: "nano_model", FLASH: "flash_model", SMOL: "smol_model"}[request.param])
