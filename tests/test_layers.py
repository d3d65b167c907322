"""Architecture rules of memt_core and memt_demo as tests that can fail (memt_proxy's are tests/proxy/test_imports.py).

Imports are read from the source (imports inside functions and under TYPE_CHECKING included), so a rule holds for
every path through the code, not only for what one process happened to import.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def import_graph(package: str) -> dict[str, set[str]]:
    """Each module of ``package`` → every module name it imports (``from a import b`` counts as ``a`` and ``a.b``)."""
    graph = {}
    for path in (ROOT / package).rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
        graph[name] = found
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles between the graph's own modules, one per module on one."""
    inside = {name: {m for m in found if m in graph and m != name} for name, found in graph.items()}

    def circle(start: str, node: str, path: list[str]) -> list[str] | None:
        for following in sorted(inside[node]):
            if following == start:
                return path + [following]
            if following not in path and (found := circle(start, following, path + [following])):
                return found
        return None

    return [c for name in sorted(inside) if (c := circle(name, name, [name]))]


def below(graph: dict[str, set[str]], layer: str, above: tuple[str, ...]) -> list[tuple[str, str]]:
    """(module, import) pairs where a module of ``layer`` imports one of the layers ``above`` it."""
    return sorted((name, m) for name, found in graph.items() if name.startswith(layer) for m in found if m.startswith(above))


def test_memt_core_layers_go_one_way_server_then_engine_then_models():
    """DESIGN §4: the HTTP server drives the engine, the engine runs the models; never the other way, and the server
    reaches the models only through the engine. The protocol machine knows none of them."""
    graph = import_graph("memt_core")
    assert below(graph, "memt_core.models", ("memt_core.engine", "memt_core.server")) == []
    assert below(graph, "memt_core.engine", ("memt_core.server",)) == []
    assert below(graph, "memt_core.server", ("memt_core.models",)) == []
    layers = ("memt_core.server", "memt_core.engine", "memt_core.models", "memt_core.parallel", "torch")
    assert below(graph, "memt_core.protocol", layers) == []


def test_the_protocol_machine_imports_without_torch():
    code = "import sys, memt_core.protocol, memt_core.protocol.machine; print('torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "False"


def test_memt_core_has_no_import_circle_outside_its_packages_init():
    """No two modules of memt_core import each other (a package's ``__init__`` re-exporting its modules aside)."""
    graph = import_graph("memt_core")
    inits = {p.parent.relative_to(ROOT).as_posix().replace("/", ".") for p in (ROOT / "memt_core").rglob("__init__.py")}
    found = [c for c in circles({n: f for n, f in graph.items() if n not in inits}) if not set(c) & inits]
    assert not found, found[0]


def test_memt_demo_has_no_import_circle():
    """Issue 59: the batched loss and the reference share their pieces through memt_demo/loss.py, not each other;
    both demo families' skeletons build their memory objects with memt_demo/config.py."""
    found = circles(import_graph("memt_demo"))
    assert not found, found[0]


def test_no_module_of_memt_core_is_over_600_lines():
    """Issue 59: a module a maintainer reads whole (the scheduler is the longest)."""
    root = Path(__file__).resolve().parents[1] / "memt_core"
    long = {str(p.relative_to(root)): n for p in root.rglob("*.py") if (n := len(p.read_text().splitlines())) > 600}
    assert not long, long
