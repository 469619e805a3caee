"""The import structure: kvfs/ (the package) <- testing/ (the shared harness) <- bench/ <- tests/.

Every module is parsed with `ast` (imports inside functions and under TYPE_CHECKING count: they
are dependencies all the same) and the import graph is checked:

- no import cycle inside kvfs/, testing/ or bench/;
- kvfs/ imports none of testing, tests, bench (it is what ships);
- testing/ imports neither tests nor bench, and bench/ does not import tests (nor names a
  tests module in a string: `python -m tests.x`, importlib);
- outside kvfs/catalog/ nothing imports kvfs.catalog.redis.scripts (the Lua scripts are the
  Redis catalog's own; the space layer calls kvfs/catalog/redis/leases.py). Tests of the
  scripts themselves (tests/unit/test_lua_scripts.py) may.

On the tree before testing/ existed this failed three ways: the cycles kvfs.write.handles <->
kvfs.write.sessions and kvfs.cli.doctor <-> kvfs.cli.doctor_clients, bench importing
tests.redis_server and tests.clients.engine, and kvfs.cluster.space importing the scripts.

And the house (issue 44): the package's top level holds only the agreed modules, every
subpackage says what it owns, no module grows past 800 lines, and the factory
(kvfs/service.py) wires every layer at construction: no attribute is assigned onto another
object after it is built, and no layer's kind is probed.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kvfs", "testing", "bench", "tests")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """Every module of the four top-level directories, by dotted name."""
    found = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            found[module_name(path)] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules `name` imports anywhere in its source: the module itself where it is one of
    ours (`from pkg import mod` names pkg.mod), else the dotted name as written."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for a in node.names:
                sub = f"{mod}.{a.name}"
                out.add(sub if sub in known else mod)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def top(mod: str) -> str:
    return mod.split(".")[0]


def cycles(g: dict[str, set[str]], within: tuple[str, ...]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module (or a
    module importing itself), among the modules of `within`."""
    nodes = [n for n in g if top(n) in within]
    edges = {n: sorted(m for m in g[n] if m in g and top(m) in within) for n in nodes}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    comps: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in edges[v]:
                comps.append(sorted(comp))

    for n in nodes:
        if n not in index:
            visit(n)
    return comps


def offending(g: dict[str, set[str]], importer: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{m} imports {i}"
        for m, deps in g.items()
        if top(m) == importer
        for i in deps
        if top(i) in forbidden
    )


def test_the_graph_sees_every_package_and_imports_inside_functions():
    g = graph()
    assert {"kvfs", "kvfs.cluster.space", "kvfs.catalog.redis.catalog"} <= g.keys()
    # sessions imports the writer inside a function: the parse must see it
    assert "kvfs.write.behind" in g["kvfs.write.sessions"]


def test_no_import_cycles():
    assert cycles(graph(), ("kvfs", "testing", "bench")) == []


def test_the_package_imports_no_harness_benchmark_or_test():
    assert offending(graph(), "kvfs", ("testing", "tests", "bench")) == []


def test_the_harness_and_the_benchmarks_import_no_test():
    g = graph()
    assert offending(g, "testing", ("tests", "bench")) == []
    assert offending(g, "bench", ("tests",)) == []


def test_the_harness_and_the_benchmarks_name_no_test_module_in_strings():
    """A subprocess `python -m tests.x` or importlib.import_module("tests.x") is an import too."""
    found = []
    for name, path in modules().items():
        if top(name) not in ("testing", "bench"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.startswith("tests.")
            ):
                found.append(f"{name}: {node.value!r}")
    assert found == []


# Outside kvfs.catalog, only these may run kvfs's Lua scripts themselves: a load generator that
# replays a node's per-file command stream against Redis (docs/cluster.md, "How far one Redis
# goes"), so it must send exactly the scripts kvfs sends.
SCRIPT_REPLAYERS = {"bench.redis_scale"}


def test_only_the_catalog_reaches_the_redis_lua_scripts():
    g = graph()
    assert (
        sorted(
            m
            for m, deps in g.items()
            if "kvfs.catalog.redis.scripts" in deps
            and not m.startswith("kvfs.catalog.")
            and top(m) != "tests"
            and m not in SCRIPT_REPLAYERS
        )
        == []
    )


# --- the house ----------------------------------------------------------------------------------
KVFS = Path(__file__).resolve().parents[2] / "kvfs"

# The top level: the entry points, the factory and the daemon, what every layer shares.
TOP_LEVEL = {
    "__init__.py",
    "__main__.py",
    "config.py",
    "daemon.py",
    "errors.py",
    "knobs.py",
    "metrics.py",
    "service.py",
    "tasks.py",
    "units.py",
}
SUBPACKAGES = {
    "catalog",
    "cli",
    "client",
    "cluster",
    "events",
    "fs",
    "pool",
    "redis",
    "space",
    "tiers",
    "write",
}
MAX_LINES = 800


def test_the_top_level_holds_the_agreed_modules_only():
    modules = {p.name for p in KVFS.glob("*.py")}
    assert modules == TOP_LEVEL, (
        f"unexpected at kvfs/: {sorted(modules - TOP_LEVEL)}; "
        f"missing: {sorted(TOP_LEVEL - modules)}"
    )
    assert len(modules) <= 12
    packages = {p.parent.name for p in KVFS.glob("*/__init__.py")}
    assert packages == SUBPACKAGES, sorted(packages ^ SUBPACKAGES)


def test_every_subpackage_says_what_it_owns():
    for init in KVFS.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc) > 40, f"{init.relative_to(KVFS.parent)}: no docstring"


def test_no_module_is_over_800_lines():
    long = {
        str(p.relative_to(KVFS.parent)): n
        for p in KVFS.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, long


def _assignments_onto_others(tree: ast.AST) -> list[str]:
    """`x.attr = ...` where x is not `self`, and `self.a.attr = ...` (onto a collaborator
    reached through self): an attribute set on another object after it was built."""
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            for sub in ast.walk(t):
                if not isinstance(sub, ast.Attribute):
                    continue
                owner = sub.value
                if isinstance(owner, ast.Name) and owner.id == "self":
                    continue
                found.append(f"line {sub.lineno}: {ast.unparse(sub)} = ...")
    return found


def _probes(tree: ast.AST) -> list[str]:
    """hasattr(x, ...) and getattr(x, name, default): asking what kind a layer is."""
    return [
        f"line {n.lineno}: {ast.unparse(n)}"
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)
        and (n.func.id == "hasattr" or (n.func.id == "getattr" and len(n.args) == 3))
    ]


def test_the_factory_wires_at_construction_only():
    tree = ast.parse((KVFS / "service.py").read_text())
    assert not _assignments_onto_others(tree), _assignments_onto_others(tree)
    assert not _probes(tree), _probes(tree)


def test_the_checks_see_what_they_forbid():
    """The two checks above catch the shapes they name (so a pass means something)."""
    bad = ast.parse(
        "def build(space, files):\n    space.evictor = files.evict\n"
        "    self.store.owner = self\n    if hasattr(space, 'lru'):\n        pass\n"
        "    getattr(space, 'releasing', 0)\n"
    )
    assert len(_assignments_onto_others(bad)) == 2
    assert len(_probes(bad)) == 2
    good = ast.parse("class S:\n    def __init__(self, x):\n        self.x = x\n")
    assert not _assignments_onto_others(good) and not _probes(good)


# --- declared errors (issue 59) --------------------------------------------------------------
# What an exception carries beyond its errno is a field of a class declared in kvfs/errors.py,
# read after an isinstance check: never getattr on a caught exception, never an attribute
# stuck onto an exception that was not declared. The exceptions of other libraries keep their
# own protocol: vLLM's OSError carries `num_succeeded`, ssl's verification error
# `verify_message`.
FOREIGN_ERROR_FIELDS = {
    ("client/vllm_tier.py", "num_succeeded"),
    ("redis/resp.py", "verify_message"),
}


def _error_probes(tree: ast.AST) -> list[str]:
    """getattr(X, "name") on a name bound by `except ... as X`, and `X.name = ...` onto one;
    as 'line: name'."""
    out = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        caught = {h.name for h in ast.walk(fn) if isinstance(h, ast.ExceptHandler) and h.name}
        for n in ast.walk(fn):
            if (
                isinstance(n, ast.Call)
                and isinstance(n.func, ast.Name)
                and n.func.id == "getattr"
                and len(n.args) >= 2
                and isinstance(n.args[0], (ast.Name, ast.Attribute))
                and isinstance(n.args[1], ast.Constant)
                and (
                    (isinstance(n.args[0], ast.Name) and n.args[0].id in caught)
                    or (isinstance(n.args[0], ast.Attribute) and n.args[0].attr == "error")
                )
            ):
                out.append(f"{n.lineno}: {n.args[1].value}")
            if isinstance(n, ast.Assign):
                for t in n.targets:
                    if (
                        isinstance(t, ast.Attribute)
                        and isinstance(t.value, ast.Name)
                        and t.value.id in caught
                    ):
                        out.append(f"set {n.lineno}: {t.attr}")
    return out


def _declared_fields() -> set[str]:
    """The fields the error classes of kvfs/errors.py (and kvfs.client.direct's) declare."""
    out = set()
    for path in (KVFS / "errors.py", KVFS / "client" / "direct.py"):
        for cls in ast.walk(ast.parse(path.read_text())):
            if isinstance(cls, ast.ClassDef) and any(
                isinstance(b, ast.Name) and b.id.endswith("Error") for b in cls.bases
            ):
                for n in ast.walk(cls):
                    if (
                        isinstance(n, ast.Attribute)
                        and isinstance(n.value, ast.Name)
                        and n.value.id == "self"
                        and isinstance(n.ctx, ast.Store)
                    ):
                        out.add(n.attr)
    return out


def test_errors_carry_declared_fields_only():
    declared = _declared_fields()
    assert {"dropped", "removed", "pending", "maybe_done", "namespace"} <= declared, declared
    found = []
    for path in sorted(KVFS.rglob("*.py")):
        rel = str(path.relative_to(KVFS))
        for probe in _error_probes(ast.parse(path.read_text())):
            line, name = probe.split(": ")
            if (rel, name) in FOREIGN_ERROR_FIELDS or (
                probe.startswith("set ") and name in declared
            ):
                continue
            found.append(f"kvfs/{rel}:{probe}")
    assert not found, found


def test_the_error_check_sees_what_it_forbids():
    bad = ast.parse(
        "def f(x):\n    try:\n        x()\n    except OSError as e:\n"
        "        e.dropped = 1\n        return getattr(e, 'removed', None)\n"
        "def g(req):\n    return getattr(req.error, 'pending', None)\n"
    )
    assert len(_error_probes(bad)) == 3
    good = ast.parse(
        "def f(x):\n    try:\n        x()\n    except Dropped as e:\n        return e.removed\n"
    )
    assert not _error_probes(good)


def _subpackage(mod: str) -> str | None:
    parts = mod.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "kvfs" and parts[1] in SUBPACKAGES else None


def package_edges(g: dict[str, set[str]]) -> dict[tuple[str, str], str]:
    """(a, b) -> one import by which subpackage a of kvfs imports subpackage b."""
    out: dict[tuple[str, str], str] = {}
    for m, deps in g.items():
        a = _subpackage(m)
        for i in deps:
            b = _subpackage(i)
            if a and b and a != b:
                out.setdefault((a, b), f"{m} imports {i}")
    return out


def test_no_two_subpackages_import_each_other():
    """Issue 59: the layers are a hierarchy, so two subpackages never import each other
    (catalog/redis and cluster/ did, through the Redis transport they share: kvfs/redis/)."""
    edges = package_edges(graph())
    both = sorted(f"{edges[a, b]} / {edges[b, a]}" for a, b in edges if a < b and (b, a) in edges)
    assert not both, both


# --- one catalog interface, chosen once (issue 59) -------------------------------------------
def _kind_checks(tree: ast.AST) -> list[str]:
    """Reads of a catalog's `shared` flag, and comparisons of a layer's `kind` with a kind of
    catalog or space: 'line: source'."""
    out = []
    kinds = {"cluster", "redis", "sqlite", "alone", "local"}
    for n in ast.walk(tree):
        if (
            isinstance(n, ast.Attribute)
            and n.attr == "shared"
            and isinstance(n.ctx, ast.Load)
            and "cat" in ast.unparse(n.value)
        ):
            out.append(f"{n.lineno}: {ast.unparse(n)}")
        if (
            isinstance(n, ast.Compare)
            and isinstance(n.left, ast.Attribute)
            and n.left.attr == "kind"
            and any(isinstance(c, ast.Constant) and c.value in kinds for c in n.comparators)
        ):
            out.append(f"{n.lineno}: {ast.unparse(n)}")
    return out


def test_the_kind_of_catalog_is_chosen_in_the_factory_only():
    """The layers are typed against kvfs.catalog.interface.Catalog; which catalog (one node,
    a shared pool) is decided in kvfs/service.py, and no other module asks."""
    found = []
    for path in sorted(KVFS.rglob("*.py")):
        rel = path.relative_to(KVFS)
        if rel.parts[0] == "catalog" or str(rel) == "service.py":
            continue
        found += [f"kvfs/{rel}:{p}" for p in _kind_checks(ast.parse(path.read_text()))]
    assert not found, found
    bad = ast.parse("if self.catalog.shared:\n    pass\nif space.kind == 'cluster':\n    pass\n")
    assert len(_kind_checks(bad)) == 2


def test_both_catalogs_implement_the_interface():
    """Every member of the Catalog protocol is a member of SqliteCatalog and RedisCatalog (a
    method or property of the class, or an attribute its classes assign), async where the
    protocol's is."""
    import inspect

    from kvfs.catalog.interface import Catalog
    from kvfs.catalog.redis.catalog import RedisCatalog
    from kvfs.catalog.sqlite import SqliteCatalog

    members = {n for n in vars(Catalog) if not n.startswith("_")} | set(Catalog.__annotations__)
    for cls in (SqliteCatalog, RedisCatalog):
        assigned = set()
        for base in cls.__mro__:
            if base.__module__.startswith("kvfs."):
                for n in ast.walk(ast.parse(inspect.getsource(base))):
                    if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
                        assigned.add(n.attr)
        missing = sorted(m for m in members if not hasattr(cls, m) and m not in assigned)
        assert not missing, (cls.__name__, missing)
        for m in members:
            want = getattr(Catalog, m, None)
            if inspect.isfunction(want):
                got = getattr(cls, m)
                assert inspect.iscoroutinefunction(want) == inspect.iscoroutinefunction(got), (
                    cls.__name__,
                    m,
                )


# --- size of a function, shape of a class (issue 59) -------------------------------------------
MAX_FUNCTION_LINES = 80
# the functions allowed past it (at most 3): the shared catalog's batch publish and its
# follower's two loops, each one protocol step by step against Redis
LONG_FUNCTIONS = {
    ("catalog/redis/catalog.py", "commit_batch"),
    ("catalog/redis/follower.py", "_follow_loop"),
    ("catalog/redis/follower.py", "_apply_entries"),
}
MAX_BASES = 2  # a class's bases, besides a Protocol or ABC: none has more (issue 59)


def test_functions_are_short_and_classes_composed():
    long, bases = set(), set()
    for path in sorted(KVFS.rglob("*.py")):
        rel = str(path.relative_to(KVFS))
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES:
                    long.add((rel, n.name))
            elif isinstance(n, ast.ClassDef):
                real = [b for b in n.bases if ast.unparse(b) not in ("Protocol", "ABC")]
                if len(real) > MAX_BASES:
                    bases.add((rel, n.name))
    assert long <= LONG_FUNCTIONS and len(LONG_FUNCTIONS) <= 3, sorted(long - LONG_FUNCTIONS)
    assert not bases, sorted(bases)
