"""The house rules a reader relies on, checked on the tree: no Python file over 600 lines,
no library function over 80 (argument parsers excepted), no internal of another library used
outside the modules docs/integrations.md lists for it ("Other libraries' internals AdaptiveLoad
relies on"), and settings read from no environment variable in the library."""

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


# Other libraries' internals, each with the modules allowed to use it: the table of
# docs/integrations.md, "Other libraries' internals AdaptiveLoad relies on".
INTERNALS = {
    r"sys\._getframe": {"sampler/readers.py", "sampler/base.py"},
    r"\b_num_workers\b|\b_prefetch_factor\b": {"sampler/readers.py"},
    r"\b_is_accelerate_prepared\b|\b_non_blocking\b": {"integrations/accelerate.py"},
    r"\b_gradient_checkpointing_func\b": {"integrations/diffusers.py"},
}


def test_other_libraries_internals_only_where_documented():
    found = {}
    for pattern, allowed in INTERNALS.items():
        for p in library_files():
            rel = str(p.relative_to(LIBRARY))
            lines = p.read_text().splitlines()
            hits = [i + 1 for i, line in enumerate(lines) if re.search(pattern, line)]
            if hits and rel not in allowed:
                found[f"{pattern} in {rel}"] = hits
    assert not found, found
    doc = (ROOT / "docs" / "integrations.md").read_text()
    for name in ("sys._getframe", "_num_workers", "_is_accelerate_prepared",
                 "_gradient_checkpointing_func"):  # fmt: skip
        assert name in doc, f"docs/integrations.md does not list {name}"


def test_library_reads_no_environment_variable():
    found = {}
    for p in library_files():
        text = p.read_text()
        if re.search(r"os\.environ|getenv\(", text):
            found[str(p.relative_to(ROOT))] = True
    assert not found, found
