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
    # issue 59: below the session layer, the shared pieces (errors, wire models, prompt, structured output, the
    # worker thread) import nothing of the layers above them
    shared = {name for name in modules if name.count(".") == 1 and name != "memt_proxy.__main__"}
    assert {"memt_proxy.protocol", "memt_proxy.prompt", "memt_proxy.worker", "memt_proxy.errors"} <= shared
    for name in shared:
        assert not {m for m in imports[name] if m not in shared and m != "memt_proxy"}, (name, imports[name] - shared)

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


def test_no_module_of_the_proxy_is_over_400_lines():
    """Issues 45 and 59: small modules named for what they hold."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "memt_proxy"
    long = {str(p.relative_to(root)): n for p in root.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long


def test_the_session_layer_is_composed_of_parts_not_mixins():
    """Issue 45: ``Sessions`` builds its parts and hands each the others it uses; no class of the session layer
    inherits from another of the proxy's classes (no part reaches another through a shared ``self``)."""
    import importlib
    import inspect
    import pkgutil

    import memt_proxy.session as package
    from memt_proxy.session.sessions import Sessions

    mixed = []
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"memt_proxy.session.{info.name}")
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__ or issubclass(cls, BaseException):
                continue
            mixed += [(name, base.__qualname__) for base in cls.__mro__[1:] if base.__module__.startswith("memt_proxy.")]
    assert mixed == []
    assert Sessions.__bases__ == (object,)
    from memt_core.client.native import AsyncNativeClient

    layer = Sessions(AsyncNativeClient("http://127.0.0.1:9"), identity=None)
    assert layer.placement.leases is layer.leases and layer.writes.leases is layer.leases
    assert layer.placement.writes is layer.writes and layer.forks.placement is layer.placement


def test_leases_own_every_acquire_and_release_and_occupancy_is_counted_in_one_place():
    """Issue 59: no part of the proxy but ``session/leases.py`` acquires, renews or releases a native lease (the others
    ask ``Leases``, a ``one_shot`` lease for an offload, a close or an unload), and a state's ``users`` is counted only
    by ``session/state.py`` (``SessionState.in_use``, the table's ``take``/``hold``/``give_back``)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "memt_proxy"
    lease_calls, counted = [], []
    for path in root.rglob("*.py"):
        text, name = path.read_text(), str(path.relative_to(root))
        if name != "session/leases.py" and re.search(r"""control\(\s*["'](acquire|renew|release)["']""", text):
            lease_calls.append(name)
        if name != "session/state.py" and re.search(r"\.users\s*[-+]=", text):
            counted.append(name)
    assert lease_calls == [] and counted == []


def test_threads_call_nothing_of_the_responses_service_back():
    """Issue 59: ``Threads`` is given the session layer and the records, no callable of the service; it returns where
    a request runs (``ThreadTurn``) and the service plans and answers."""
    import inspect

    from memt_proxy.responses.threads import Threads

    assert list(inspect.signature(Threads.__init__).parameters) == ["self", "sessions", "records", "snapshots_per_chain"]


def test_no_part_of_the_proxy_holds_a_callable_of_another():
    """Issue 59: no callback cycles (Leases ⇄ Placement, NamedForks ⇄ Sessions.turn, ChatService ⇄ ChatMemory ⇄
    TurnRunner, ResponsesService ⇄ Threads, Upstream ⇄ Sessions): a part is given the parts below it and what it
    uses as arguments, and returns a plan or a result. No part's constructor takes a callable (the frozen plans it
    returns, dataclasses, may carry one), and the session layer's built parts hold no bound method of another."""
    import dataclasses
    import importlib
    import inspect
    import pkgutil

    takes = []
    for name in ("memt_proxy.session", "memt_proxy.chat", "memt_proxy.responses"):
        package = importlib.import_module(name)
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"{name}.{info.name}")
            for cls_name, cls in inspect.getmembers(module, inspect.isclass):
                if cls.__module__ != module.__name__ or dataclasses.is_dataclass(cls) or "__init__" not in cls.__dict__:
                    continue
                for parameter in inspect.signature(cls.__init__).parameters.values():
                    if any(word in str(parameter.annotation) for word in ("Callable", "Awaitable", "AsyncContextManager")):
                        takes.append(f"{module.__name__}.{cls_name}({parameter.name})")
    assert takes == []
    from memt_core.client.native import AsyncNativeClient
    from memt_proxy.session.sessions import Sessions

    layer = Sessions(AsyncNativeClient("http://127.0.0.1:9"), identity=None)
    parts = [layer.upstream, layer.leases, layer.writes, layer.placement, layer.forks]
    held = [(type(part).__name__, key) for part in parts for key, value in vars(part).items() if inspect.ismethod(value)]
    assert held == []


def test_a_session_found_upstream_is_adopted_in_one_place():
    """Issue 59: adopt-by-inspect (ask the upstream, then take the session over with its record) is written once,
    ``Placement.adopt_existing``; every other part calls it."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "memt_proxy"
    adopting = []
    for path in root.rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\.adopt\(", line):
                adopting.append((str(path.relative_to(root)), line.strip()))
    assert adopting == [("session/placement.py", "self.adopt(state, native)")]


def test_request_context_travels_as_its_own_object_not_on_the_request_models():
    """Issue 59: a request's context (tenant, policy, size, digest, retry, key) is a frozen ``RequestContext`` built once,
    never private attributes set on the pydantic request models."""
    import dataclasses
    import re
    from pathlib import Path

    from memt_proxy.request_context import RequestContext

    root = Path(__file__).resolve().parents[2] / "memt_proxy"
    private = [str(p.relative_to(root)) for p in root.rglob("*.py") if re.search(r"PrivateAttr|\brequest\._[a-z]", p.read_text())]
    assert private == []
    context = RequestContext("t", "auto", 10, "d")
    try:
        context.policy = "off"  # type: ignore[misc]
    except dataclasses.FrozenInstanceError:
        pass
    else:
        raise AssertionError("RequestContext is not frozen")


def test_the_prefix_index_changes_only_through_kept_states():
    """Issue 59 (1): the index of kept states is ``KeptStates``' own: outside ``session/kept.py`` it is only read (the
    header-less plan finds states in it); what changes it goes through ``KeptStates``' API (``move``, ``reserve``, ``made``,
    ``answered``, ``abandon``, ``found_elsewhere``, ``close``)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "memt_proxy"
    changing = [
        (str(path.relative_to(root)), line.strip())
        for path in root.rglob("*.py") if str(path.relative_to(root)) != "session/kept.py"
        for line in path.read_text().splitlines() if re.search(r"prefixes\.(move|drop|reserve|made|answered)\(|PrefixIndex\(", line)
    ]
    assert changing == []


def test_no_session_test_sleeps():
    """Issue 59: the session layer's tests wait for no time: time comes from the harness's ``StoppedClock``, and
    concurrent requests are interleaved by event-loop rounds (``session_harness.turns``) or wait on a state."""
    import re
    from pathlib import Path

    folder = Path(__file__).resolve().parent / "session"
    sleeping = [p.name for p in folder.glob("test_*.py") if re.search(r"time\.sleep|asyncio\.sleep", p.read_text())]
    assert sleeping == []
    # nor does the harness they share: its waits (``until``, ``turns``) yield event-loop rounds, ``asyncio.sleep(0)``
    harness = (folder / "session_harness.py").read_text()
    assert not re.search(r"time\.sleep|asyncio\.sleep\((?!0\))", harness), re.findall(r".*asyncio\.sleep\((?!0\)).*", harness)


def test_the_tests_mirror_the_code():
    """Issue 59 (5): each module of the session layer, the surfaces and the HTTP shell has its own test file, named after
    it (``memt_proxy/<part>/<module>.py`` → ``tests/proxy/<part>/test_<part>_<module>.py``)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    missing = [
        str(module.relative_to(root))
        for part in ("session", "chat", "responses", "http")
        for module in sorted((root / "memt_proxy" / part).glob("*.py"))
        if module.name != "__init__.py" and not (root / "tests" / "proxy" / part / f"test_{part}_{module.stem}.py").exists()
    ]
    assert not missing, missing
