"""The proxy installs without PyTorch (the ``proxy`` extra): importing it must not pull torch in."""

from __future__ import annotations

import subprocess
import sys


def test_the_proxy_imports_without_torch():
    code = "import sys, memt_proxy.__main__, memt_proxy.app, memt_proxy.responses; print('torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "False"


def test_no_import_circle_and_the_responses_surface_imports_nothing_of_the_chat_surface():
    """Issue 45: the proxy's modules import one another without a circle (imports inside functions and under
    TYPE_CHECKING included), and the Responses surface takes what both surfaces share from the shared modules."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    modules = {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p for p in (root / "memt_proxy").rglob("*.py")}
    imports: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
        imports[name] = {module for module in found if module in modules and module != name}
    for surface in ("memt_proxy.responses", "memt_proxy.responses_stream", "memt_proxy.responses_routes"):
        assert "memt_proxy.serving" not in imports[surface] and "memt_proxy.chat_routes" not in imports[surface], surface

    def circle(start: str, node: str, path: list[str]) -> list[str] | None:
        for following in sorted(imports[node]):
            if following == start:
                return path + [following]
            if following not in path:
                found = circle(start, following, path + [following])
                if found:
                    return found
        return None

    circles = [c for name in sorted(modules) if (c := circle(name, name, [name]))]
    assert not circles, circles[0]
