"""The proxy installs without PyTorch (the ``proxy`` extra): importing it must not pull torch in."""

from __future__ import annotations

import subprocess
import sys


def test_the_proxy_imports_without_torch():
    code = "import sys, memt_proxy.__main__, memt_proxy.http.app, memt_proxy.responses.service; print('torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "False"


def test_no_import_circle_and_the_responses_surface_imports_nothing_of_the_chat_surface():
    """Issue 45: the proxy's modules import one another without a circle (imports inside functions and under
    TYPE_CHECKING included), each layer only those below it (HTTP shell → surfaces → session layer), and the Responses
    surface takes what both surfaces share from the shared modules."""
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
    chat = {name for name in modules if name.startswith("memt_proxy.chat")} | {"memt_proxy.http.chat_routes"}
    for surface in [name for name in modules if name.startswith("memt_proxy.responses")] + ["memt_proxy.http.responses_routes"]:
        assert not imports[surface] & chat, (surface, imports[surface] & chat)
    # the layers: the session layer knows no surface and no HTTP; the surfaces know no HTTP
    for name in modules:
        if name.startswith(("memt_proxy.session", "memt_proxy.chat", "memt_proxy.responses")):
            assert not {m for m in imports[name] if m.startswith("memt_proxy.http")}, name
        if name.startswith("memt_proxy.session"):
            assert not {m for m in imports[name] if m.startswith(("memt_proxy.chat", "memt_proxy.responses"))}, name

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


def test_no_module_of_the_proxy_is_over_450_lines():
    """Issue 45: small modules named for what they hold."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "memt_proxy"
    long = {str(p.relative_to(root)): n for p in root.rglob("*.py") if (n := len(p.read_text().splitlines())) > 450}
    assert not long, long
