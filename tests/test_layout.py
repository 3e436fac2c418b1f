"""How the code base reads: short modules with one job and short functions,
package folders of a size a reader can hold, no import cycle between modules or
packages, every module of the library and of the program in one of its package's
rings (which `lint-imports` checks, from pyproject.toml), and docstrings that explain
rather than record measurements."""

import ast
import glob
import os
import re
import tomllib

import pytest
from helpers import REPOSITORY

pytestmark = pytest.mark.once("jax")  # reads source files, not the backend

PACKAGE = "keras_transformer"  # the library
PROGRAM = "keras_transformer_app"  # the program beside it
# Body lines of a function, its docstring left out.
LONGEST_FUNCTION = 60
# Lines of one package folder (its modules together).
LARGEST_PACKAGE = 2500


def python_files(*folders):
    return sorted(path for folder in folders
                  for path in glob.glob(os.path.join(REPOSITORY, folder, "**", "*.py"),
                                        recursive=True))


def module_name(path):
    name = os.path.relpath(path, REPOSITORY)[:-3].replace(os.sep, ".")
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def in_package(module):
    """Whether `module` is one of the two packages or one of their modules."""
    return any(module == name or module.startswith(name + ".") for name in (PACKAGE, PROGRAM))


def imported_modules(path, known):
    """The packages' modules that `path` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.ImportFrom) and in_package(node.module or ""):
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in known else node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if in_package(alias.name)}
    return found


def import_graph():
    paths = {module_name(path): path for path in python_files(PACKAGE, PROGRAM)}
    return {name: imported_modules(path, paths) - {name} for name, path in paths.items()}


def first_cycle(graph):
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if state.get(other) == "open":
                return stack[stack.index(other):] + [other]
            if other not in state and (cycle := visit(other)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def part(module):
    """keras_transformer.inference.beam -> "keras_transformer.inference"; a package's
    root -> None."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else None


def rings(package):
    """The rings of `package`'s layers contract in pyproject.toml, outermost first: each
    a set of modules."""
    with open(os.path.join(REPOSITORY, "pyproject.toml"), "rb") as file:
        contracts = tomllib.load(file)["tool"]["importlinter"]["contracts"]
    [layers] = [contract["layers"] for contract in contracts if contract["type"] == "layers"
                and all(layer.startswith(package + ".") for layer in contract["layers"])]
    return [{name.strip() for name in layer.split("|")} for layer in layers]


@pytest.mark.parametrize("folder, most", [(PACKAGE, 450), (PROGRAM, 450), ("benchmarks", 450),
                                          ("recipes", 150)])
def test_modules_are_short(folder, most):
    long = {os.path.relpath(path, REPOSITORY): lines for path in python_files(folder)
            if (lines := sum(1 for _ in open(path, encoding="utf-8"))) > most}
    assert long == {}


def function_lengths(path):
    """(name, first line, body lines) of every function in a file."""
    found = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]
            if body:
                found.append((node.name, node.lineno, node.end_lineno - body[0].lineno + 1))
    return found


def test_function_lengths_are_counted_without_the_docstring():
    lines = ["def f():", '    """Doc', '    string."""', "    a = 1", "", "    return a"]
    path = os.path.join(os.path.dirname(__file__), "..", ".function_lengths_probe.py")
    try:
        with open(path, "w", encoding="utf-8") as file:
            file.write("\n".join(lines) + "\n")
        assert function_lengths(path) == [("f", 1, 3)]
    finally:
        os.remove(path)


@pytest.mark.parametrize("folder", [PACKAGE, PROGRAM, "recipes", "benchmarks"])
def test_functions_are_short(folder):
    long = [f"{os.path.relpath(path, REPOSITORY)}:{line} {name} ({lines} lines)"
            for path in python_files(folder)
            for name, line, lines in function_lengths(path) if lines > LONGEST_FUNCTION]
    assert long == []


def test_package_folders_are_of_a_readable_size():
    sizes = {}
    for path in python_files(PACKAGE, PROGRAM):
        folder = os.path.relpath(os.path.dirname(path), REPOSITORY)
        sizes[folder] = sizes.get(folder, 0) + sum(1 for _ in open(path, encoding="utf-8"))
    assert {folder: lines for folder, lines in sizes.items() if lines > LARGEST_PACKAGE} == {}


def test_no_module_imports_a_module_that_imports_it_back():
    graph = import_graph()
    assert first_cycle(graph) is None
    packages = {}
    for module, imported in graph.items():
        for other in imported:
            if part(module) and part(other) and part(module) != part(other):
                packages.setdefault(part(module), set()).add(part(other))
    assert first_cycle(packages) is None


@pytest.mark.parametrize("package", [PACKAGE, PROGRAM])
def test_every_module_is_in_one_of_its_packages_rings(package):
    """`lint-imports` checks the rings' order; a module in no ring it would not check."""
    named = set().union(*rings(package))
    parts = {part(module) for module in import_graph() if module.startswith(package + ".")}
    assert parts - named == set(), "modules in no ring of pyproject.toml"
    assert named - parts == set(), "rings naming modules that are not there"


def test_the_layers_use_keras_ops_and_no_backend_directly():
    for path in python_files(os.path.join(PACKAGE, "layers")):
        imports = {alias.name.split(".")[0] for node in ast.walk(ast.parse(open(path).read()))
                   if isinstance(node, (ast.Import, ast.ImportFrom))
                   for alias in (node.names if isinstance(node, ast.Import)
                                 else [ast.alias(node.module or "")])}
        assert not imports & {"torch", "jax", "tensorflow"}, path


def test_docstrings_carry_no_measurements():
    """Figures and their history live in docs/ and benchmarks/RESULTS.md."""
    pattern = re.compile(r"RESULTS\.md|\b202\d-\d\d-\d\d\b|\d ?(ms|µs)\b")
    found = [f"{os.path.relpath(path, REPOSITORY)}:{number}: {line.strip()}"
             for path in python_files(PACKAGE, PROGRAM)
             for number, line in enumerate(open(path, encoding="utf-8"), 1)
             if pattern.search(line)]
    assert found == []
