# Architecture rules that a refactor could silently break.
from __future__ import annotations

import ast
import importlib
import inspect
import os
import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STORAGE = ROOT / "daemon" / "sessionstored" / "storage"
PACKAGES = {"sessionstore": ROOT / "client", "sessionstored": ROOT / "daemon", "bench": ROOT}
# the daemon's start-up: the only modules outside storage/ that name an engine's own modules
START_UP = {
    "sessionstored.commands.cli",
    "sessionstored.commands.rekey_command",
    "sessionstored.commands.restore_command",
}
ENGINE_PACKAGES = ("sessionstored.storage.log", "sessionstored.storage.postgres")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _modules() -> dict[str, tuple[Path, bool]]:
    """Every module of both packages: name -> (file, is a package)."""
    found = {}
    for top, base in PACKAGES.items():
        for path in (base / top).rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _import_graph() -> dict[str, set[str]]:
    """Module -> the modules it imports: at the top, inside functions, under
    TYPE_CHECKING, all of them. `from package import name` imports the package, or
    the submodule when name is one."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names if alias.name in modules)
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
                if not node.level:
                    target = node.module or ""
                for alias in node.names:
                    if f"{target}.{alias.name}" in modules:
                        edges.add(f"{target}.{alias.name}")
                    elif target in modules:
                        edges.add(target)
        edges.discard(name)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for other in graph[module]:
            if other not in order:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], order[other])
        if low[module] == order[module]:
            component = []
            while (member := stack.pop()) != module:
                component.append(member)
            if component:
                found.append(sorted([module, *component]))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return found


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for other in graph[todo.pop()] - seen:
            seen.add(other)
            todo.append(other)
    return seen


def test_no_import_cycle_anywhere() -> None:
    assert _cycles(_import_graph()) == []


def test_the_cycle_finder_finds_one() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_postgresql_imports_no_module_of_the_log() -> None:
    graph = _import_graph()
    for module in graph:
        if module.startswith("sessionstored.storage.postgres"):
            log_modules = {m for m in _reachable(graph, module) if ".storage.log" in m}
            assert not log_modules, (module, log_modules)


def test_the_daemon_names_an_engine_only_at_start_up() -> None:
    """Outside storage/, only the start-up imports an engine's own modules: the rest of
    the daemon holds it as storage.engine.Engine."""
    for module, edges in _import_graph().items():
        if not module.startswith("sessionstored") or module.startswith("sessionstored.storage"):
            continue  # (the bench and the tests may open an engine's modules)
        if module in START_UP:
            continue
        engines = {e for e in edges if e.startswith(ENGINE_PACKAGES)}
        assert not engines, (module, engines)


# the daemon's packages, top to bottom: a package imports only those below it (and the
# shared top-level modules: access, config, exit_codes, failpoints, notify)
LAYERS = ("commands", "front", "ops", "workers", "writer", "storage")


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "sessionstored" or len(parts) < 2 or parts[1] not in LAYERS:
        return None  # a shared top-level module, or not the daemon
    return LAYERS.index(parts[1])


def test_the_data_path_never_runs_back_up() -> None:
    """commands -> front (socket, connections) -> ops (parse, prepare, steps) -> workers ->
    writer -> storage (engine -> log | PostgreSQL -> OS seam), and the wire layer imports
    nothing outside itself. (An op's Rewrite callback runs in the writer's thread; what
    it calls is the ops' own module, never the other way.)"""
    engines_use = ("sessionstored.storage", "sessionstore.wire")
    upward = set()
    for module, edges in _import_graph().items():
        if module.startswith("sessionstored.storage"):
            above = {e for e in edges if not e.startswith(engines_use)}
            assert not above, (module, above)
        if module.startswith("sessionstore.wire"):
            outside = {e for e in edges if not e.startswith("sessionstore.wire")}
            assert not outside, (module, outside)
        layer = _layer(module)
        if module.startswith("sessionstored.") and module.split(".")[1] not in {
            "commands",
            "__main__",
        }:
            assert not {e for e in edges if e.startswith("sessionstored.commands")}, module
        for edge in edges:
            other = _layer(edge)
            if layer is not None and other is not None and other < layer:
                upward.add((module, edge))
    assert upward == set()


MAX_FUNCTION_LINES = 100
# tables of options, one add_argument call each: long, and read as a list
OPTION_TABLES = {("client/sessionstore/tools/cli_parser.py", "build_parser"),
                 ("daemon/sessionstored/config.py", "_parser")}  # fmt: skip


def test_no_function_of_the_daemon_or_the_clients_is_over_100_lines() -> None:
    """Modules are split by concern, whatever their length; a function that does one
    thing fits on a screen or two."""
    listed = subprocess.run(
        ["git", "ls-files", "daemon/*.py", "client/*.py"], cwd=ROOT, capture_output=True, text=True
    )
    modules = listed.stdout.split()
    assert len(modules) > 100
    long = set()
    for name in modules:
        for node in ast.walk(ast.parse((ROOT / name).read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                    long.add((name, node.name))
    assert long == OPTION_TABLES


def test_the_shared_top_level_modules_stay_few() -> None:
    top = sorted(p.stem for p in (ROOT / "daemon" / "sessionstored").glob("*.py"))
    assert top == ["__init__", "__main__", "access", "config", "exit_codes", "failpoints", "notify"]


def test_every_storage_exception_lives_in_storage_errors() -> None:
    import sessionstored.storage

    defined = {}
    for info in pkgutil.walk_packages(sessionstored.storage.__path__, "sessionstored.storage."):
        module = importlib.import_module(info.name)
        for name, member in vars(module).items():
            ours = inspect.isclass(member) and member.__module__.startswith(info.name)
            if ours and issubclass(member, BaseException):
                defined[name] = member.__module__
    assert len(defined) >= 17
    assert set(defined.values()) == {"sessionstored.storage.errors"}, defined


def test_storage_imports_no_trio() -> None:
    for path in STORAGE.rglob("*.py"):
        assert "trio" not in _imports(path), path
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, sessionstored.storage.log.store, sessionstored.storage.log.recovery,"
            " sessionstored.storage.log.check; print('trio' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.strip() == "False"


def test_only_the_seam_calls_os_for_data_files() -> None:
    for path in STORAGE.rglob("*.py"):
        if path == STORAGE / "log" / "fs.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                assert node.value.id != "os", f"{path.name} calls os.{node.attr}"
        assert "os" not in _imports(path), path


def _wheel(tmp_path: Path, environment: dict[str, str] | None = None) -> set[str]:
    """The names in the wheel `pip install .` makes, built from a copy of the sources (no
    build directory of an earlier build in it). The request path is left interpreted
    (`make compile` builds it, in place): this is about the sources and the helper."""
    import zipfile

    source = tmp_path / "source"
    skip = shutil.ignore_patterns(".*", "build", "*.so", "__pycache__", "*.egg-info", "fixtures")
    shutil.copytree(ROOT, source, ignore=skip)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(source)],
        check=True, capture_output=True,
        env={**(environment or os.environ), "SESSIONSTORE_BUILD": "interpreted"},
    )  # fmt: skip
    (wheel,) = tmp_path.glob("sessionstore-*.whl")
    return set(zipfile.ZipFile(wheel).namelist())


def test_every_package_is_in_the_wheel(tmp_path: Path) -> None:
    """The wheel `pip install .` makes holds every package directory and py.typed, and
    the compiled CBOR helper (this machine has a C compiler)."""
    names = _wheel(tmp_path)
    for top, base in (("sessionstore", ROOT / "client"), ("sessionstored", ROOT / "daemon")):
        for source in (base / top).rglob("*.py"):
            assert str(source.relative_to(base)) in names, f"{source} is not in the wheel"
        assert f"{top}/py.typed" in names
    assert not any("__pycache__" in name or name.startswith(("tests/", "bench/")) for name in names)
    assert any(_is_helper(name) for name in names), "no compiled CBOR helper in the wheel"


def test_without_a_c_compiler_the_wheel_builds_without_the_helper(tmp_path: Path) -> None:
    """No working compiler: `pip install .` still succeeds, with the Python twin alone."""
    names = _wheel(tmp_path, {**os.environ, "CC": "/bin/false", "LDSHARED": "/bin/false"})
    assert "sessionstore/wire/cbor_bytes_python.py" in names
    assert not any(_is_helper(name) for name in names)


def _is_helper(name: str) -> bool:
    return name.startswith("sessionstore/wire/_cbor_bytes.") and name.endswith(".so")


def test_the_adapters_are_optional() -> None:
    """The clients load without the frameworks: only the adapter modules import them."""
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, sessionstore, sessionstore.client, sessionstore.trio_client,"
            " sessionstore.asyncio_client, sessionstore.tools.cli;"
            " print(sorted({'langgraph', 'agents', 'langchain_core', 'google.adk', 'strands'}"
            " & set(sys.modules)))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.strip() == "[]"
    for path in (ROOT / "client" / "sessionstore").glob("*.py"):
        frameworks = _imports(path) & {"langgraph", "agents", "langchain_core", "google", "strands"}
        assert not frameworks or path.stem in {"langgraph", "agents", "adk", "strands"}, path


def test_each_extra_installs_what_the_readme_examples_import() -> None:
    """`pip install -e '.[langgraph]'` (or `[agents]`) must bring every distribution whose
    modules the README's examples of that adapter import."""
    import importlib.metadata
    import re
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    readme = (ROOT / "README.md").read_text()
    owners: dict[str, set[str]] = {}
    for dist in importlib.metadata.distributions():
        for file in dist.files or []:
            if file.suffix == ".py":
                module = ".".join(file.with_suffix("").parts).removesuffix(".__init__")
                owners.setdefault(module, set()).add(dist.metadata["Name"].lower())
    for extra, top in (("langgraph", "langgraph"), ("agents", "agents")):
        wanted = {re.split(r"[<>=\[ ;]", r)[0].lower() for r in extras[extra]}
        imported = set(re.findall(rf"^\s*(?:from|import) ({top}(?:\.\w+)*)", readme, re.M))
        assert imported, f"the README shows no {top} import"
        for module in imported:
            assert owners.get(module, set()) & wanted, (extra, module, owners.get(module))


DAEMON_ONLY = ("psycopg", "psycopg_pool", "numpy", "prometheus_client")


def test_the_clients_and_the_command_line_need_none_of_the_daemons_dependencies() -> None:
    """`pip install sessionstore` brings the clients and `sessionstore` alone: they run
    with the daemon's dependencies absent, and `sessionstored` then says what to
    install, in one line."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    required = {re.split(r"[<>=\[ ;]", r)[0] for r in project["dependencies"]}
    extra = {re.split(r"[<>=\[ ;]", r)[0] for r in project["optional-dependencies"]["daemon"]}
    assert {"psycopg", "psycopg-pool", "numpy", "prometheus-client"} <= extra - required
    absent = f"import sys; sys.modules.update(dict.fromkeys({DAEMON_ONLY!r}));"
    clients = subprocess.run(
        [sys.executable, "-c", absent + " import sessionstore, sessionstore.trio_client,"
         " sessionstore.effects; from sessionstore.tools import cli; cli.main(['--help'])"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert clients.returncode == 0 and "usage: sessionstore" in clients.stdout, clients.stderr
    daemon = subprocess.run(
        [sys.executable, "-c", absent + " from sessionstored.commands.entry import main;"
         " sys.exit(main([]))"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert daemon.returncode == 1 and "Traceback" not in daemon.stderr
    assert daemon.stderr.strip().endswith("pip install 'sessionstore[daemon]'")
    assert len(daemon.stderr.strip().splitlines()) == 1
