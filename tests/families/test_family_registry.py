"""Model families as data: a family defined only here loads end to end, and nothing else branches on names.

``TestNano`` is a renamed Nano variant (its own model_type, architecture, name, and memory on one
layer only). Registering it is all it takes for a checkpoint of it to be built, read, loaded,
written to and queried through the in-process API, and prompted and parsed by the client.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from memt_core import families
from memt_core.checkpoint import read_checkpoint
from memt_core.errors import CheckpointError
from memt_core.families.base import resolve
from memt_core.families.nano import Nano

REPO = Path(__file__).resolve().parents[2]


class TestNano(Nano):
    __test__ = False  # a family, not a pytest class

    name = "memt-test-nano"
    model_type = "memt_test_qwen3_5_moe"
    architecture = "MemTTestQwen3_5MoeForCausalLM"

    def tiny_config(self, tokenizer, *, hidden_size=64, chunk_tokens=32):
        config = super().tiny_config(tokenizer, hidden_size=hidden_size, chunk_tokens=chunk_tokens)
        config["memt"]["memory_layers"] = [3]
        return config


@pytest.fixture
def test_family():
    family = families.register(TestNano())
    try:
        yield family
    finally:
        families.unregister(family.name)


@pytest.fixture(scope="module")
def test_checkpoint(tmp_path_factory) -> Path:
    """A tiny random checkpoint of the test family (registered only while it is built)."""
    from memt_core.tiny import make_tiny_checkpoint

    family = families.register(TestNano())
    try:
        return make_tiny_checkpoint(tmp_path_factory.mktemp("test-family"), family, chunk_tokens=16)
    finally:
        families.unregister(family.name)


# --------------------------------------------------------------------------- the registry


def test_builtin_families_are_registered():
    assert families.names() == (families.NANO, families.FLASH, families.SMOL)
    assert families.get(families.NANO).model_type == "memt_qwen3_5_moe"
    assert families.by_model_type("memt_deepseek_v4") is families.get(families.FLASH)
    assert families.by_model_type("qwen3_5_moe") is None


def test_register_refuses_a_clash(test_family):
    with pytest.raises(ValueError, match="clashes"):
        families.register(TestNano())  # same name and model_type

    class SameModelType(Nano):
        name = "memt-other"

    with pytest.raises(ValueError, match="clashes"):
        families.register(SameModelType())  # Nano's model_type under another name
    assert families.names() == (families.NANO, families.FLASH, families.SMOL, "memt-test-nano")


def test_unknown_family_name():
    with pytest.raises(ValueError, match="unknown model family 'memt-huge'.*memt-nano"):
        families.get("memt-huge")


def test_a_checkpoint_of_an_unregistered_family_is_refused(test_checkpoint):
    with pytest.raises(CheckpointError, match="unknown model_type 'memt_test_qwen3_5_moe'"):
        read_checkpoint(test_checkpoint)


# --------------------------------------------------------------------------- end to end


def test_a_registered_test_family_loads_commits_and_answers(test_family, test_checkpoint):
    """read_checkpoint → load the model → a commit and a query through ``memt_core.inference``."""
    from memt_core.inference import MemTRuntime, memory_batch
    from memt_core.sampling import SamplingParams

    checkpoint = read_checkpoint(test_checkpoint)
    assert checkpoint.family is test_family and checkpoint.model == "memt-test-nano"
    assert checkpoint.model_type == "memt_test_qwen3_5_moe" and checkpoint.checkpoint_id == "tiny-random-test-nano"
    assert checkpoint.memory.memory_layers == (3,) and checkpoint.memory.chunk_tokens == 16

    runtime = MemTRuntime.load(test_checkpoint)
    model = runtime.model
    assert model.memory_layers == (3,)
    assert model.attention(3) is model.backbone.model.layers[3].self_attn
    session = runtime.open_session()
    result = session.commit(list(range(5, 45)))
    assert (result.tokens, result.write_events) == (40, 3)  # 16 + 16 + 8 tokens
    assert list(session.memory.layers()) == [3]
    assert session.memory.get(3).shape == (1, 2, 16, 16) and session.memory.get(3).abs().max() > 0

    prompt = torch.tensor([list(range(50, 62))])
    with torch.no_grad():
        empty = model(prompt).logits
        read = model(prompt, memory=memory_batch(model, [session.memory])).logits
    assert (read - empty).abs().max() > 1e-3  # the query reads what the commit wrote
    answer = session.generate(prompt[0].tolist(), SamplingParams(max_new_tokens=4, temperature=0))
    assert 1 <= len(answer.output_ids) <= 4 and answer.finish_reason in ("stop", "length")


def test_the_family_is_part_of_the_identity(test_family, test_checkpoint, tmp_path):
    """The same files under Nano's model_type are another model: another snapshot identity."""
    as_nano = tmp_path / "as-nano"
    shutil.copytree(test_checkpoint, as_nano)
    config = json.loads((as_nano / "config.json").read_text())
    config.update(model_type="memt_qwen3_5_moe", architectures=["MemTQwen3_5MoeForCausalLM"])
    (as_nano / "config.json").write_text(json.dumps(config))
    nano = read_checkpoint(as_nano)
    test = read_checkpoint(test_checkpoint)
    assert nano.model == families.NANO and nano.backbone == test.backbone and nano.memory == test.memory
    assert nano.identity() != test.identity()


def test_the_client_prompts_and_parses_the_test_family(test_family, test_checkpoint):
    from memt_core.client import NanoChatFormat, load_chat_format, load_tokenizer, parser_for

    tokenizer = load_tokenizer(test_checkpoint)
    chat_format, parser = load_chat_format(test_checkpoint, tokenizer=tokenizer)
    assert isinstance(chat_format, NanoChatFormat) and chat_format.family == parser.family == "memt-test-nano"
    assert chat_format.user_ids("hello", enable_thinking=False) == tokenizer.encode(
        tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True,
                                      tokenize=False, enable_thinking=False),
        add_special_tokens=False,
    )
    parsed = parser_for("memt-test-nano").parse('<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>')
    assert [(call.name, call.arguments) for call in parsed.tool_calls] == [("f", '{"x": 1}')]


# --------------------------------------------------------------------------- no branches on names, light imports

FAMILY_NAME = r"""(?:\bNANO\b|\bFLASH\b|["']memt[-_](?:nano|flash|qwen3_5_moe|deepseek_v4)["'])"""
BRANCH = re.compile(rf"(?:[=!]=|\bin\b)\s*[(\[{{]?\s*{FAMILY_NAME}|{FAMILY_NAME}\s*(?:[=!]=|\bif\b)")


def test_no_code_outside_the_registry_branches_on_a_family_name():
    files = [p for package in ("memt_core", "memt_proxy") for p in (REPO / package).rglob("*.py")]
    outside = [p for p in files if (REPO / "memt_core" / "families") not in p.parents]
    assert len(outside) > 20
    offenders = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in outside
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if BRANCH.search(line)
    ]
    assert offenders == []


def test_the_pattern_finds_a_branch():
    """The check above is not vacuous: it sees the branches it forbids."""
    for line in ('if checkpoint.model == NANO:', 'x = a if family != "memt-flash" else b', 'if model_type in ("memt_qwen3_5_moe",):'):
        assert BRANCH.search(line), line
    assert not BRANCH.search('model = families.get(name)')


def test_the_registry_and_the_client_side_import_without_torch():
    code = (
        "import sys; import memt_core.families, memt_core.checkpoint, memt_core.client.chat_format, "
        "memt_core.client.parsers, memt_core.client.cli; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- the families are the floor

ABOVE = ("memt_core.client", "memt_core.models", "memt_core.checkpoint")


def imported_modules(path: Path) -> set[str]:
    """Every module an ``import`` in ``path`` names, wherever it stands (in functions, under TYPE_CHECKING too)."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            modules.update([node.module, *(f"{node.module}.{alias.name}" for alias in node.names)])
    return modules


def test_the_families_import_nothing_above_them():
    """No import loop (checkpoint → families → client → checkpoint) and no upward arrow: the families name
    what they use of the client and the models as strings, which those layers resolve."""
    files = sorted((REPO / "memt_core" / "families").rglob("*.py"))
    assert len(files) >= 4
    upward = {
        f"{path.relative_to(REPO)}: {module}"
        for path in files
        for module in imported_modules(path)
        if any(module == above or module.startswith(above + ".") for above in ABOVE)
    }
    assert upward == set()


def test_the_families_references_resolve_in_their_layers():
    from memt_core.client.chat_format import ChatFormat
    from memt_core.client.parsers import OutputParser
    from memt_core.models import kernels

    for family in map(families.get, families.names()):
        assert issubclass(resolve(family.chat_format_class), ChatFormat), family
        parser = resolve(family.parser_class)(family.name)
        assert isinstance(parser, OutputParser) and parser.family == family.name, family
        assert family.kernels and all(resolve(kernel).__module__ == kernels.__name__ for kernel in family.kernels), family
    assert resolve("memt_core.models.kernels:use_experts") is kernels.use_experts
    with pytest.raises(ValueError, match="not a 'module:name' reference"):
        resolve("memt_core.models.kernels.use_experts")


def test_the_encoder_a_client_executes(tmp_path):
    """Flash: the named script, else the checkpoint's own, else a FileNotFoundError; Nano takes none."""
    flash, nano = families.get(families.FLASH), families.get(families.NANO)
    with pytest.raises(FileNotFoundError, match="has no encoding_dsv4.py; pass its location as deepseek_encoder"):
        flash.encoder(tmp_path)
    (tmp_path / "encoding_dsv4.py").write_text("")
    assert flash.encoder(tmp_path) == tmp_path / "encoding_dsv4.py"
    assert flash.encoder(tmp_path, "elsewhere.py") == Path("elsewhere.py")
    assert (flash.takes_encoder, nano.takes_encoder) == (True, False)
