"""The package's layout rules, read from the source with ast (nothing is imported): imports run one way
(no cycle), the engine knows no HTTP, only the model package touches llama.cpp, and functions and
modules stay short enough to read whole."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "appliance"
MAX_FUNCTION_LINES = 50
MAX_MODULE_LINES = 450


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources() -> dict[str, Path]:
    """Every module of the package by dotted name (a package's __init__ under the package's name)."""
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _base(name: str, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` reads from (a relative import resolved against `name`)."""
    if node.level == 0:
        return node.module or ""
    package = name.split(".")
    if MODULES[name].name != "__init__.py":
        package.pop()
    package = package[: len(package) - node.level + 1]
    return ".".join(package + ([node.module] if node.module else []))


def imported(name: str, tree: ast.Module) -> Iterator[str]:
    """Every module name `tree` imports, at any depth (function-level imports included); for
    `from a import b` this is `a.b` when that is a module, else `a`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _base(name, node)
            for alias in node.names:
                yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base


MODULES = sources()
TREES = {name: parse(path) for name, path in MODULES.items()}


def graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports."""
    return {name: {target for target in imported(name, tree) if target in MODULES and target != name}
            for name, tree in TREES.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path that ends where it starts, or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in sorted(edges):
        if state.get(root):
            continue
        path = [root]
        stack = [iter(sorted(edges[root]))]
        state[root] = 1
        while stack:
            target = next(stack[-1], None)
            if target is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(target) == 1:
                return path[path.index(target):] + [target]
            elif not state.get(target):
                state[target] = 1
                path.append(target)
                stack.append(iter(sorted(edges[target])))
    return None


def test_no_import_cycle() -> None:
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_find_cycle_sees_a_cycle() -> None:
    # The check itself: a cycle two steps round is found, a diamond is not a cycle.
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}) is None


def _importers_of(prefixes: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    for name, tree in TREES.items():
        for target in imported(name, tree):
            if any(target == prefix or target.startswith(prefix + ".") for prefix in prefixes):
                yield name, target


def test_engine_knows_no_http() -> None:
    offenders = sorted({f"{name} imports {target}" for name, target in _importers_of(("starlette", "uvicorn", "appliance.http"))
                        if name == "appliance.engine" or name.startswith("appliance.engine.")})
    assert not offenders, "\n".join(offenders)


def _in(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_engine_imports_nothing_of_the_http_side() -> None:
    # The engine publishes (snapshot, events) and the HTTP side reads: the engine, its KV code
    # included, imports no HTTP module and no Prometheus object to write into.
    offenders = sorted({f"{name} imports {target}"
                        for name, target in _importers_of(("appliance.http", "prometheus_client", "starlette"))
                        if _in(name, "appliance.engine")})
    assert not offenders, "\n".join(offenders)


def test_kv_code_sits_below_the_scheduler() -> None:
    # One owner of the KV budget below both the scheduler and the store (nano-vllm's block
    # manager): kv/ never reads the scheduler's lists.
    offenders = sorted({f"{name} imports {target}" for name, target in _importers_of(("appliance.engine.scheduler",))
                        if _in(name, "appliance.engine.kv")})
    assert not offenders, "\n".join(offenders)


def _api_of(name: str) -> str | None:
    """The API folder (openai, llama, ollama, ...) a module of http/api/ belongs to, or None."""
    parts = name.split(".")
    return parts[3] if len(parts) >= 4 and parts[:3] == ["appliance", "http", "api"] else None


def test_api_folders_import_no_other_api() -> None:
    # A front-end speaks one API and imports only shared modules: every module under
    # http/api/ lives in its API's folder, and none imports another API folder's modules.
    loose = sorted(name for name in MODULES if _api_of(name) and MODULES[name].parent == PACKAGE / "http" / "api")
    assert not loose, "modules of http/api/ outside an API folder:\n" + "\n".join(loose)
    offenders = sorted({f"{name} imports {target}" for name, target in _importers_of(("appliance.http.api",))
                        if _api_of(name) is not None and _api_of(target) != _api_of(name)})
    assert not offenders, "\n".join(offenders)


def test_only_the_model_package_imports_llama_cpp() -> None:
    offenders = sorted({f"{name} imports {target}" for name, target in _importers_of(("llama_cpp",))
                        if not (name == "appliance.model" or name.startswith("appliance.model."))})
    assert not offenders, "\n".join(offenders)


def test_only_the_store_imports_a_database_driver() -> None:
    # One store layer below everything that keeps rows (issue 48): people, chats, usage and the
    # library reach sqlite3 and psycopg through appliance.store, which itself sits at the
    # bottom beside config, errors and statedir.
    offenders = sorted({f"{name} imports {target}" for name, target in _importers_of(("sqlite3", "psycopg"))
                        if not _in(name, "appliance.store")})
    assert not offenders, "\n".join(offenders)
    below = ("appliance.store", "appliance.config", "appliance.errors", "appliance.statedir")
    upward = sorted({f"{name} imports {target}" for name, target in _importers_of(("appliance",))
                     if _in(name, "appliance.store") and not any(_in(target, b) for b in below)})
    assert not upward, "\n".join(upward)


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method with its qualified name (Class.method, outer.inner)."""
    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield prefix + child.name, child
                yield from walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)
    return walk(tree, "")


def test_functions_and_modules_are_short() -> None:
    offenders = []
    for name, path in MODULES.items():
        relative = path.relative_to(PACKAGE.parent)
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_MODULE_LINES:
            offenders.append(f"{relative}: module {lines} lines")
        for qualified, function in _functions(TREES[name]):
            length = (function.end_lineno or function.lineno) - function.lineno + 1
            if length > MAX_FUNCTION_LINES:
                offenders.append(f"{relative}:{function.lineno} {qualified} {length} lines")
    assert not offenders, (f"{len(offenders)} over {MAX_FUNCTION_LINES} lines a function or {MAX_MODULE_LINES} a module:\n"
                           + "\n".join(offenders))


MAX_ENGINE_LINES = 350
ENGINE_REASON = "Over 350 lines because"


def test_engine_modules_are_sized_by_responsibility() -> None:
    """The engine (kv/ and policy/ included) keeps to ~350 lines a module: its modules hold
    one job each, not as much as a cap allows. A longer one says why in the first
    paragraph of its docstring, in a sentence starting "Over 350 lines because"."""
    offenders = []
    for name, path in MODULES.items():
        if not _in(name, "appliance.engine"):
            continue
        lines = len(path.read_text(encoding="utf-8").splitlines())
        first_paragraph = (ast.get_docstring(TREES[name]) or "").split("\n\n")[0]
        if lines > MAX_ENGINE_LINES and ENGINE_REASON not in " ".join(first_paragraph.split()):
            offenders.append(f"{path.relative_to(PACKAGE.parent)}: {lines} lines, no reason given")
    assert not offenders, "\n".join(offenders)


def test_no_test_module_imports_another() -> None:
    """What tests share lives in tests/helpers/; a test module importing another would make
    the layers' folders depend on each other's files."""
    tests = PACKAGE.parent / "tests"
    names = {p.stem for p in tests.rglob("test_*.py")}
    offenders = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(parse(path)):
            targets = ([a.name for a in node.names] if isinstance(node, ast.Import)
                       else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.relative_to(tests)} imports {t}" for t in targets
                          if t.split(".")[-1] in names or t.startswith("tests.")]
    assert not offenders, "\n".join(offenders)


def _calls_library_search(tree: ast.Module) -> bool:
    """Whether the code calls a library's search: `<something naming a library>.search(...)`."""
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "search"
               and "lib" in ast.unparse(node.func.value).lower() for node in ast.walk(tree))


def test_only_the_prompt_builder_searches_the_library() -> None:
    # Retrieval is a step of the one prompt builder (http/retrieval.py, called by
    # http/prompting.prepare): no other module outside library/ searches the library or
    # puts its passages in a prompt (library/cite.py), so every chat API cites the same way.
    builder = {"appliance.http.prompting", "appliance.http.retrieval"}

    def outside(name: str) -> bool:
        return not _in(name, "appliance.library") and name not in builder

    offenders = sorted({f"{name} imports {target}" for name, target in _importers_of(("appliance.library.cite",))
                        if outside(name)}
                       | {f"{name} calls a library's search" for name, tree in TREES.items()
                          if outside(name) and _calls_library_search(tree)})
    assert not offenders, "\n".join(offenders)
    # The check itself: the wrapper retrieval replaced (http/sources.py) is seen, a regex's search is not.
    assert _calls_library_search(ast.parse("async def consult(app):\n    return await library_of(app).search(s, q)"))
    assert not _calls_library_search(ast.parse("_QUANT.search(model_id)"))


def test_the_guard_holds_no_path_table() -> None:
    # What a path needs is declared by its route (http/routing.py) and read by the guard: a
    # module-level path, or tuple/list/set of paths, in guard.py is a table beside the routes.
    def is_path(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("/")

    offenders = []
    for node in TREES["appliance.http.guard"].body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            value = node.value
            items = value.elts if isinstance(value, (ast.Tuple, ast.List, ast.Set)) else [value]
            if any(is_path(item) for item in items):
                offenders.append(f"guard.py:{node.lineno} {ast.unparse(node)[:60]}")
    assert not offenders, "\n".join(offenders)
