"""Layering, read from the code (ast, no import runs): `mlrelease` never imports the Airflow plugins or the drills
package, no layer of `mlrelease` imports a higher one, and each factory lives apart from the Protocol it builds.

Every import counts, at module level or inside a function (a lazy import is still a dependency); the only
exceptions are in ALLOWED, each with its reason.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

SRC = REPO / "src"
PLUGINS = REPO / "plugins"
PRODUCT, DRILLS, AIRFLOW = "mlrelease", "mlrelease_drills", "mlrelease_airflow"

# The layers of `mlrelease`, lowest first. A unit is a subpackage or a top-level module of `mlrelease`; it may
# import its own layer and the layers below, never one above. Derived from what the code does: the foundations
# every part shares; data < quality < model (training reads the quality ledger); serving (the Triton repository
# and clients) and verdicts (pure statistics) need only the foundations; the gateway serves models; the rollout
# drives the gateway's routing and judges its decision log; the summary reads rollout records; the report and
# the deploy renderer read everything below; the steps compose it all; the CLI and the step declarations
# (imported by the DAGs through plugins/) sit on top.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "foundations",
        frozenset(
            {
                "__init__",
                "cohort_rules",
                "errors",
                "exit_codes",
                "feast_store",
                "freshness",
                "gitinfo",
                "outcome",
                "registry",
                "release_spec",
                "settings",
                "sources",
                "spec_features",
                "storage",
                "timewindow",
                "watermarks",
                "xcom",
                "yamlconfig",
            }
        ),
    ),
    ("spark: the data half's engine session and local cluster", frozenset({"spark"})),
    ("data", frozenset({"data"})),
    ("quality", frozenset({"quality"})),
    ("model, serving, verdicts", frozenset({"model", "serving", "verdicts"})),
    ("gateway", frozenset({"gateway"})),
    ("rollout", frozenset({"rollout"})),
    ("summary", frozenset({"summary"})),
    ("report, deploy", frozenset({"report", "deploy"})),
    ("steps", frozenset({"steps"})),
    ("entry points", frozenset({"cli", "entry", "models_cli", "stepdefs"})),
)
LAYER_OF = {unit: rank for rank, (_, units) in enumerate(LAYERS) for unit in units}

# (importing module, imported module) -> why this import may break a rule. Each must be lazy (inside a function).
ALLOWED: dict[tuple[str, str], str] = {
    ("mlrelease.steps.export", "mlrelease_drills.faults"): (
        "the drill hook of `make run CANDIDATE_FAULT=…`: drill_candidate is imported only when "
        "MLRELEASE_DRILL_CANDIDATE_FAULT is set, and a missing package is a clear StepError"
    ),
}


@dataclass(frozen=True)
class Import:
    """One import statement's target, where it is, and whether it runs only when a function is called."""

    source: str  # the importing module
    target: str  # the imported module (or module.name for `from package import name`)
    line: int
    lazy: bool

    def __str__(self) -> str:
        return f"{self.source}:{self.line} imports {self.target}"


def module_name(path: Path, root: Path) -> str:
    """The dotted module name of a file under `root` (a package's __init__ is the package)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(node: ast.ImportFrom, source: str, is_package: bool) -> str:
    """The absolute module of a `from … import` (resolving relative imports against `source`)."""
    if not node.level:
        return node.module or ""
    base = source.split(".") if is_package else source.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports(source: str, text: str, *, is_package: bool = False) -> Iterator[Import]:
    """Every import in a module's text: statements, and importlib.import_module / __import__ of a literal name."""

    def walk(node: ast.AST, lazy: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            inside = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import):
                yield from (Import(source, alias.name, child.lineno, lazy) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                module = _absolute(child, source, is_package)
                yield Import(source, module, child.lineno, lazy)
                # `from package import submodule` depends on the submodule: report it by its full name too.
                yield from (Import(source, f"{module}.{alias.name}", child.lineno, lazy) for alias in child.names)
            elif isinstance(child, ast.Call) and _dynamic_target(child):
                yield Import(source, _dynamic_target(child), child.lineno, lazy)
            yield from walk(child, inside)

    yield from walk(ast.parse(text), False)


def _dynamic_target(call: ast.Call) -> str:
    """The literal module name of importlib.import_module("…") or __import__("…"); "" for any other call."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name in ("import_module", "__import__") and call.args and isinstance(call.args[0], ast.Constant):
        return str(call.args[0].value)
    return ""


def product_units() -> set[str]:
    """The units of `mlrelease`: each subpackage and each top-level module, and `__init__`."""
    package = SRC / PRODUCT
    modules = {p.stem for p in package.glob("*.py")}
    return modules | {p.parent.name for p in package.glob("*/__init__.py")}


def unit(module: str, units: set[str]) -> str | None:
    """The `mlrelease` unit a module belongs to; None outside `mlrelease`. A name of `mlrelease/__init__` is its own."""
    parts = module.split(".")
    if parts[0] != PRODUCT:
        return None
    return parts[1] if len(parts) > 1 and parts[1] in units else "__init__"


def package_of(module: str) -> str:
    """The top-level package of a dotted module name."""
    return module.split(".")[0]


def source_files(root: Path, package: str) -> Iterator[tuple[str, Path]]:
    """(module name, path) of every Python file of `package` under `root`."""
    for path in sorted((root / package).rglob("*.py")):
        yield module_name(path, root), path


def all_imports(root: Path, package: str) -> list[Import]:
    """Every import of every module of `package`."""
    found: list[Import] = []
    for module, path in source_files(root, package):
        found += imports(module, path.read_text(encoding="utf-8"), is_package=path.name == "__init__.py")
    return found


def allowed_reason(imp: Import, allowed: dict[tuple[str, str], str]) -> str | None:
    """Why `imp` may break a rule (an ALLOWED entry for its module, or for a name imported from it); else None."""
    for (source, target), reason in allowed.items():
        if imp.source == source and (imp.target == target or imp.target.startswith(target + ".")):
            return reason
    return None


def violations(found: list[Import], units: set[str], allowed: dict[tuple[str, str], str]) -> list[str]:
    """What breaks the rules among `mlrelease`'s imports, one line each; ALLOWED entries must be lazy."""
    problems = []
    for imp in found:
        if unit(imp.source, units) is None:
            continue
        reason = allowed_reason(imp, allowed)
        if reason is not None:
            if not imp.lazy:
                problems.append(f"{imp} at module level: its exception ({reason}) holds only inside a function")
            continue
        target_package = package_of(imp.target)
        if target_package in (AIRFLOW, "plugins"):
            problems.append(f"{imp}: mlrelease never imports the Airflow plugins (plugins/)")
        elif target_package == DRILLS:
            problems.append(f"{imp}: mlrelease never imports the drills package (add to ALLOWED with a reason)")
        elif target_package == PRODUCT:
            source_unit, target_unit = unit(imp.source, units), unit(imp.target, units)
            assert source_unit is not None and target_unit is not None
            if LAYER_OF[target_unit] > LAYER_OF[source_unit]:
                problems.append(
                    f"{imp}: layer {LAYERS[LAYER_OF[source_unit]][0]!r} ({source_unit}) may not import the higher "
                    f"layer {LAYERS[LAYER_OF[target_unit]][0]!r} ({target_unit})"
                )
    return sorted(set(problems))


@pytest.fixture(scope="module")
def product_imports() -> list[Import]:
    """Every import of every module of `mlrelease`."""
    return all_imports(SRC, PRODUCT)


def test_every_unit_of_mlrelease_has_one_layer():
    units = product_units()
    placed = [u for _, layer in LAYERS for u in layer]
    assert len(placed) == len(set(placed)), "a unit is in two layers"
    assert units - set(placed) == set(), "new units of mlrelease: put each in a layer of LAYERS"
    assert set(placed) - units == set(), "LAYERS names units that no longer exist"


def test_no_layer_imports_a_higher_one_and_mlrelease_never_imports_plugins_or_drills(product_imports):
    assert violations(product_imports, product_units(), ALLOWED) == []


def test_every_allowed_exception_is_still_used(product_imports):
    used = {(imp.source, imp.target) for imp in product_imports}
    assert set(ALLOWED) - used == set(), "an exception no import needs any more: remove it from ALLOWED"


def test_mlrelease_never_puts_the_plugins_folder_on_the_path():
    """Importing through sys.path (as render-pods once did) hides the dependency from every check above."""
    found = []
    for module, path in source_files(SRC, PRODUCT):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value == "plugins":
                found.append(f"{module}:{node.lineno}")
    assert found == []


def test_plugins_and_drills_do_not_import_each_other():
    """The Airflow glue runs in production, the drills never do; the drills need no Airflow plugin."""
    plugin_imports = all_imports(PLUGINS, AIRFLOW)
    drill_imports = all_imports(SRC, DRILLS)
    assert [str(i) for i in plugin_imports if package_of(i.target) == DRILLS] == []
    assert [str(i) for i in drill_imports if package_of(i.target) in (AIRFLOW, "plugins")] == []


def test_each_factory_lives_apart_from_the_protocol_it_builds():
    """A module that declares a Protocol defines no `open_*` factory: each factory has its own module."""
    found = []
    for root, package in ((SRC, PRODUCT), (SRC, DRILLS), (PLUGINS, AIRFLOW)):
        for module, path in source_files(root, package):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            protocols = [
                n.name
                for n in tree.body
                if isinstance(n, ast.ClassDef) and any(ast.unparse(b).endswith("Protocol") for b in n.bases)
            ]
            factories = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("open_")]
            if protocols and factories:
                found.append(f"{module}: Protocol {protocols} with factory {factories}")
    assert found == []


# ---- the checks themselves catch what they are for ----------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "text", "expected"),
    [
        ("mlrelease.serving.repo", "from mlrelease.steps.export import export", "layer 'model, serving, verdicts'"),
        ("mlrelease.rollout.x", "def f():\n    from mlrelease import cli", "may not import the higher layer"),
        ("mlrelease.render", "import mlrelease_airflow.catalog", "never imports the Airflow plugins"),
        ("mlrelease.steps.train", "from mlrelease_drills.faults import faulty_model", "never imports the drills"),
        ("mlrelease.data.x", "import importlib\nimportlib.import_module('mlrelease.quality')", "higher layer"),
        ("mlrelease.steps.export", "from mlrelease_drills.faults import drill_candidate", "at module level"),
    ],
)
def test_a_bad_import_is_reported(source, text, expected):
    found = list(imports(source, text))
    problems = violations(found, product_units(), ALLOWED)
    assert any(expected in p for p in problems), problems


def test_imports_down_the_layers_and_lazy_allowed_ones_pass():
    text = "from mlrelease.serving.triton_repo import model_repository\nfrom mlrelease import errors\n"
    assert violations(list(imports("mlrelease.steps.x", text)), product_units(), ALLOWED) == []
    hook = "def hook():\n    from mlrelease_drills.faults import drill_candidate\n"
    assert violations(list(imports("mlrelease.steps.export", hook)), product_units(), ALLOWED) == []


def test_relative_imports_resolve_to_their_module():
    found = [i.target for i in imports("mlrelease.rollout.context", "from ..steps import export")]
    assert found == ["mlrelease.steps", "mlrelease.steps.export"]


def import_cycles(found: list[Import], package: str) -> list[list[str]]:
    """Cycles among the modules of `package` (every import counts, lazy ones too), each as a path back to its start."""
    modules = {imp.source for imp in found if imp.source.startswith(package + ".")}
    edges = {m: sorted({i.target for i in found if i.source == m and i.target in modules} - {m}) for m in modules}
    cycles, done = [], set()

    def visit(module: str, path: list[str]) -> None:
        for nxt in edges[module]:
            if nxt in path:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in done:
                visit(nxt, [*path, nxt])
        done.add(module)

    for start in sorted(modules):
        if start not in done:
            visit(start, [start])
    return cycles


def test_serving_has_no_import_cycle(product_imports):
    # up/down (local_triton), the supervisor, reconcile and endpoint read the local server's layout from a leaf
    # module (local_layout) instead of importing one another
    assert import_cycles(product_imports, f"{PRODUCT}.serving") == []


def test_an_import_cycle_is_found_through_a_lazy_import():
    found = [
        *imports("pkg.a", "import pkg.b\n"),
        *imports("pkg.b", "def f():\n    from pkg.c import g\n"),
        *imports("pkg.c", "from pkg import a\n"),
        *imports("pkg.d", "import pkg.a\n"),
    ]
    assert import_cycles(found, "pkg") == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
