"""The house rules a reader relies on, checked on the tree: no Python file over 600 lines,
no library function over 80 (argument parsers excepted), no stack inspection and no private
name of another library (attributes, keywords, modules) in the library, settings read from
no environment variable in the library, and the model families importing no integration."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "python" / "adaptiveload"
PARSERS = {"build_parser"}


def library_files():
    return sorted(p for p in LIBRARY.rglob("*.py") if "egg-info" not in str(p))


def test_no_library_file_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in library_files()
            if (n := len(p.read_text().splitlines())) > 600}  # fmt: skip
    assert not long, long


def test_no_python_file_of_the_tree_over_600_lines():
    folders = ("python", "tests", "benchmarks", "examples", "scripts")
    files = [p for d in folders for p in (ROOT / d).rglob("*.py") if "egg-info" not in str(p)]
    long = {str(p.relative_to(ROOT)): n for p in files
            if (n := len(p.read_text().splitlines())) > 600}  # fmt: skip
    assert not long, long


def test_no_library_function_over_80_lines():
    long = {}
    for p in library_files():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > 80 and node.name not in PARSERS:
                    long[f"{p.relative_to(ROOT)}:{node.lineno} {node.name}"] = n
    assert not long, long


# Underscored names the library may reach on objects that are not ``self``/``cls``: all its
# own (the same class's other instance, the extension module, the library's registered ops).
OWN_PRIVATE = {
    ("cost.py", "other._core"),
    ("ops.py", "_C._tuning_table"),
    ("ops.py", "_C._variants"),
    ("ops.py", "torch.ops.adaptiveload._last_configs"),
}


def private_module(name: str) -> bool:
    """Whether ``name`` is an underscored module of another package (``__future__`` is not)."""
    parts = name.split(".")
    return parts[0] != "adaptiveload" and any(
        p.startswith("_") and not p.startswith("__") for p in parts
    )


def private_uses(tree, rel):
    """Each reach into a private name from ``rel``: attributes ``x._name`` on anything but
    ``self``/``cls`` (dunders aside), ``_name=`` keyword arguments, imports from underscored
    modules of other packages, and the caller's-stack machinery."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if node.attr in ("f_locals", "f_back", "f_globals", "_getframe"):
                found.append(f"{rel}:{node.lineno} {ast.unparse(node)}")
            elif node.attr.startswith("_") and not node.attr.startswith("__"):
                text = ast.unparse(node)
                base = ast.unparse(node.value)
                if base not in ("self", "cls") and (rel, text) not in OWN_PRIVATE:
                    found.append(f"{rel}:{node.lineno} {text}")
        elif isinstance(node, ast.keyword) and node.arg and node.arg.startswith("_"):
            found.append(f"{rel}:{node.lineno} keyword {node.arg}=")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if private_module(node.module):
                found.append(f"{rel}:{node.lineno} from {node.module}")
        elif isinstance(node, ast.Import):
            found += [f"{rel}:{node.lineno} import {a.name}" for a in node.names
                      if private_module(a.name)]  # fmt: skip
    return found


def test_no_stack_inspection_and_no_other_librarys_private_names():
    found = []
    for p in library_files():
        rel = str(p.relative_to(LIBRARY))
        text = p.read_text()
        found += private_uses(ast.parse(text), rel)
        if re.search(r"_getframe|inspect\.(stack|currentframe)|gc\.get_referrers", text):
            found.append(f"{rel}: stack or referrer inspection")
    assert not found, found


def test_the_private_name_check_can_fail():
    samples = {
        "sys._getframe(1)": "sys._getframe",
        "loader._num_workers": "loader._num_workers",
        "DataLoaderShard(ds, _non_blocking=True)": "keyword _non_blocking=",
        "from torch._dynamo import config": "from torch._dynamo",
        "frame.f_locals.get('self')": "frame.f_locals",
    }
    for code, expected in samples.items():
        hits = private_uses(ast.parse(code), "x.py")
        assert any(expected in h for h in hits), (code, hits)
    assert private_uses(ast.parse("self._plan = None; cls._x"), "x.py") == []


def test_library_reads_no_environment_variable():
    found = {}
    for p in library_files():
        text = p.read_text()
        if re.search(r"os\.environ|getenv\(", text):
            found[str(p.relative_to(ROOT))] = True
    assert not found, found


def imported_modules(tree) -> set[str]:
    """The absolute module names a file imports, at its top or inside functions."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_model_families_import_no_integration():
    # Integrations (the fused patches, accelerate) build on the families; a family names its
    # patch module as a string that ModelFamily imports when asked, so there is no cycle.
    found = {}
    for p in sorted((LIBRARY / "models").glob("*.py")):
        bad = sorted(m for m in imported_modules(ast.parse(p.read_text()))
                     if m.startswith("adaptiveload.integrations"))  # fmt: skip
        if bad:
            found[str(p.relative_to(ROOT))] = bad
    assert not found, found


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(LIBRARY.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the library modules it imports, anywhere in the file (top level, functions,
    ``TYPE_CHECKING`` blocks): ``from P.x import y`` reaches ``P.x`` and ``P.x.y`` where that
    is a module, and a package ``P`` (its ``__init__``) from outside it. The top package is
    left out: every module is in it."""
    files = {module_name(p): p for p in library_files()}
    packages = {module_name(p) for p in library_files() if p.name == "__init__.py"}
    graph = {}
    for name, path in files.items():
        reached = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                parts = target.split(".")
                for i in range(2, len(parts) + 1):
                    module = ".".join(parts[:i])
                    inside = name == module or name.startswith(module + ".")
                    if module in files and not (module in packages and inside):
                        reached.add(module)
        reached.discard(name)
        graph[name] = reached
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_in_the_library():
    assert circles(import_graph()) == []


def test_the_circle_check_can_fail():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
