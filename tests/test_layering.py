"""Dependencies point one way, as drawn in DESIGN.md ("Layers and who may import whom").

Proves, by reading every .py file of each package with `ast` (nothing is imported or run), that:
- log/ imports no network, asyncio or Raft library and no other dmq layer;
- groups/ does no I/O and reads no clock or randomness: it imports none of the modules that
  would let it, and no other layer;
- raft/ is consensus only: every module of raft/ imports only pysyncobj, crc32c, the
  standard library (`sys.stdlib_module_names` of the running Python) and raft itself;
- the state machines (dmq/metadata, dmq/partition) do not import the broker that composes
  them, and dmq/broker imports neither http_api nor the CLI;
- http_api/ reaches storage, Raft and the group protocol only through dmq.broker;
- no module of the project imports itself back through others (no import circle).
- the clients (spark_io/, jepsen/) reach the broker only through its HTTP API (dmq.client).

Imports are `import x`, `from x import y` (relative ones resolved), and `importlib.import_module`
or `__import__` called with a literal name; imports under `if TYPE_CHECKING:` count too, as the
layering is about what a package knows, not only what it loads. A package that does not exist
yet, or holds no .py file, passes. Exceptions go in ALLOWED, one line each with the reason, so
that every crossing of a layer is visible in review.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# (file relative to the repository root, dotted module it imports) -> allowed anyway.
# Keep each entry on its own line with a comment saying why; test_allowed_entries_are_used
# fails when an entry no longer matches an import, so the list cannot go stale.
ALLOWED: frozenset[tuple[str, str]] = frozenset(
    {
        # The record chain and numpy varint reader that the broker's produce check
        # (log.records.validate_batch) runs are the Spark reader's too: one copy, in log/.
        ("spark_io/_arrow.py", "log.record_walk"),
        ("spark_io/_arrow.py", "log.varint"),  # the scalar varint reader beside it
    }
)

LAYERS = frozenset({"dmq", "log", "raft", "http_api", "groups", "spark_io"})
CLIENTS = frozenset({"jepsen", "bench"})
# Every package of the project whose modules take part in the import graph.
PROJECT_PACKAGES = ("dmq", "raft", "log", "http_api", "groups", "spark_io", "jepsen", "bench")
# Modules through which code reaches files, the network, processes or threads.
IO_MODULES = frozenset({"asyncio", "socket", "aiohttp", "pysyncobj", "select", "selectors"}) | {
    "os", "io", "pathlib", "shutil", "tempfile", "subprocess", "threading", "multiprocessing"
}  # fmt: skip
# Replicated apply must give the same state on every replica: time comes in as an argument
# and ids come in the command, never from the clock or a random source.
CLOCK_AND_RANDOM_MODULES = frozenset({"time", "random", "secrets", "uuid"})


@dataclass(frozen=True, slots=True)
class Rule:
    package: str
    forbidden: frozenset[str]  # top-level or dotted module names; submodules match too
    reason: str


RULES = (
    Rule(
        "log",
        frozenset({"aiohttp", "pysyncobj", "asyncio", "socket"}) | (LAYERS - {"log"}),
        "log/ is a synchronous storage engine that knows nothing of the network, "
        "asyncio, Raft or any other layer",
    ),
    Rule(
        "groups",
        IO_MODULES | CLOCK_AND_RANDOM_MODULES | (LAYERS - {"groups"}),
        "groups/ is a pure, deterministic state machine: no I/O, no clock, no randomness, "
        "no other layer",
    ),
    Rule(
        "raft",
        frozenset({"aiohttp"}) | (LAYERS - {"raft"}) | CLIENTS,
        "raft/ is consensus only: it turns proposals into applied commands for any state "
        "machine and knows neither HTTP nor the application (the state machines live in "
        "dmq/partition and dmq/metadata)",
    ),
    Rule(
        "dmq/metadata",
        frozenset({"dmq.broker", "dmq.cli", "dmq.server", "http_api"}) | CLIENTS,
        "dmq/metadata/ is the catalogue's state machine and its service: the broker "
        "composes it, never the other way round",
    ),
    Rule(
        "dmq/partition",
        frozenset({"dmq.broker", "dmq.cli", "dmq.server", "http_api"}) | CLIENTS,
        "dmq/partition/ is a partition's state machine and replica: the broker composes "
        "it, never the other way round",
    ),
    Rule(
        "dmq/broker",
        frozenset({"dmq.cli", "dmq.server", "http_api"}) | CLIENTS,
        "dmq/broker/ serves http_api and is started by dmq.server: it imports neither",
    ),
    Rule(
        "http_api",
        frozenset({"pysyncobj", "raft", "log", "groups", "spark_io", "dmq.cli"})
        | frozenset({"dmq.metadata", "dmq.partition"}),
        "http_api/ handlers are thin and go through dmq.broker",
    ),
    Rule(
        "spark_io",
        frozenset({"pysyncobj", "log", "raft", "groups", "http_api"}),
        "spark_io/ is a client: it talks HTTP through dmq.client",
    ),
    Rule(
        "jepsen",
        frozenset({"pysyncobj", "log", "raft", "groups", "http_api"}),
        "jepsen/ is a client: it talks HTTP through dmq.client",
    ),
)


@dataclass(frozen=True, slots=True)
class Import:
    path: str  # relative to the repository root, with forward slashes
    line: int
    module: str  # absolute dotted name


def python_files(package: str) -> list[Path]:
    directory = ROOT / package
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.rglob("*.py") if "__pycache__" not in p.parts)


def imports_of(source: str, path: str) -> Iterator[Import]:
    """Every module a file imports. `path` (e.g. "log/segment.py") resolves relative imports."""
    tree = ast.parse(source, filename=path)
    package_parts = path.removesuffix(".py").split("/")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(path, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                assert node.module is not None
                yield Import(path, node.lineno, node.module)
                continue
            base = package_parts[: len(package_parts) - (node.level - 1)]
            if node.module:
                yield Import(path, node.lineno, ".".join([*base, node.module]))
            else:
                for alias in node.names:
                    yield Import(path, node.lineno, ".".join([*base, alias.name]))
        elif isinstance(node, ast.Call) and (name := literal_import_name(node)):
            yield Import(path, node.lineno, name)


def literal_import_name(call: ast.Call) -> str | None:
    """The module named by `importlib.import_module("x")` or `__import__("x")`, if literal."""
    func = call.func
    dynamic = (isinstance(func, ast.Name) and func.id in ("__import__", "import_module")) or (
        isinstance(func, ast.Attribute) and func.attr == "import_module"
    )
    if not dynamic or not call.args:
        return None
    first = call.args[0]
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def package_imports(package: str) -> list[Import]:
    found: list[Import] = []
    for file in python_files(package):
        relative = file.relative_to(ROOT).as_posix()
        try:
            found.extend(imports_of(file.read_text(encoding="utf-8"), relative))
        except SyntaxError as error:
            pytest.fail(
                f"{relative}:{error.lineno}: does not parse, so its imports "
                f"cannot be checked: {error.msg}"
            )
    return found


def matches(module: str, forbidden: frozenset[str]) -> str | None:
    """The forbidden name `module` falls under (itself or a parent package), if any."""
    parts = module.split(".")
    for end in range(1, len(parts) + 1):
        prefix = ".".join(parts[:end])
        if prefix in forbidden:
            return prefix
    return None


@pytest.mark.parametrize("rule", RULES, ids=[rule.package for rule in RULES])
def test_package_imports_only_what_its_layer_may(rule: Rule) -> None:
    violations = [
        f"{imp.path}:{imp.line}: imports {imp.module} ({rule.package}/ must not import {hit})"
        for imp in package_imports(rule.package)
        if (hit := matches(imp.module, rule.forbidden)) and (imp.path, imp.module) not in ALLOWED
    ]
    assert not violations, rule.reason + ":\n" + "\n".join(violations)


def test_allowed_entries_are_used() -> None:
    seen = {(imp.path, imp.module) for rule in RULES for imp in package_imports(rule.package)}
    stale = sorted(ALLOWED - seen)
    assert not stale, f"ALLOWED entries that match no import any more, remove them: {stale}"


def test_import_reader_sees_every_form() -> None:
    # The rules pass trivially if the reader misses imports; pin down what it sees.
    source = "\n".join(
        [
            "import os.path, socket as s",
            "from aiohttp import web",
            "from . import segment",
            "from ..raft import replica",
            "from .index import OffsetIndex",
            "if TYPE_CHECKING:",
            "    import dmq.broker",
            "def f():",
            "    importlib.import_module('pysyncobj')",
            "    __import__('asyncio')",
        ]
    )
    seen = sorted((imp.line, imp.module) for imp in imports_of(source, "log/sub/mod.py"))
    assert seen == [
        (1, "os.path"),
        (1, "socket"),
        (2, "aiohttp"),
        (3, "log.sub.segment"),
        (4, "log.raft"),
        (5, "log.sub.index"),
        (7, "dmq.broker"),
        (9, "pysyncobj"),
        (10, "asyncio"),
    ]
    assert matches("os.path", frozenset({"os"})) == "os"
    assert matches("osx", frozenset({"os"})) is None
    assert matches("dmq.broker", frozenset({"dmq.broker"})) == "dmq.broker"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (a name resolves to its longest module).

    A submodule importing its own package (`from dmq import errors` inside dmq.broker) is
    no edge: Python loads the package first anyway, so it cannot close a circle alone.
    """
    files = {module_name(f): f for pkg in PROJECT_PACKAGES for f in python_files(pkg)}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, file in files.items():
        relative = file.relative_to(ROOT).as_posix()
        for target in imported_modules(file.read_text(encoding="utf-8"), relative):
            while target and target not in files:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                graph[name].add(target)
    return graph


def imported_modules(source: str, path: str) -> Iterator[str]:
    """imports_of, plus `x.y` for every `from x import y`, which may name a module."""
    for imp in imports_of(source, path):
        yield imp.module
    package_parts = path.removesuffix(".py").split("/")[:-1]
    for node in ast.walk(ast.parse(source, filename=path)):
        if isinstance(node, ast.ImportFrom) and node.module:
            base = package_parts[: len(package_parts) - (node.level - 1)] if node.level else []
            yield from (".".join([*base, node.module, alias.name]) for alias in node.names)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circle_among_the_project_modules() -> None:
    found = circles(import_graph())
    assert not found, "import circles (cut each with a shared module both sides import):\n" + (
        "\n".join(" <-> ".join(c) for c in found)
    )


def test_circle_finder_finds_a_circle_and_only_circles() -> None:
    # The check passes trivially if the finder misses circles; pin it on a known graph.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert circles(graph) == [["a", "b", "c"]]
    assert import_graph()["dmq.server"] >= {"dmq.broker", "http_api.app"}
    assert set(imported_modules("from raft import node", "raft/membership.py")) == {
        "raft",
        "raft.node",
    }


MODULE_LINES_MAX = 1000  # past this a module is several things; aim for 700 (STYLE.md)


def test_no_module_is_over_the_line_limit() -> None:
    # bench/ is left out: a benchmark script is a flat list of scenarios, read top to bottom.
    sizes = {
        file.relative_to(ROOT).as_posix(): len(file.read_text(encoding="utf-8").splitlines())
        for pkg in PROJECT_PACKAGES
        if pkg != "bench"
        for file in python_files(pkg)
    }
    large = {path: n for path, n in sizes.items() if n > MODULE_LINES_MAX}
    assert not large, f"modules over {MODULE_LINES_MAX} lines, split them: {large}"


# What raft/ may import besides the standard library and itself (DESIGN.md: "it imports
# pysyncobj, crc32c and the stdlib"). A state machine or a codec it needs comes in through
# the apply/snapshot/restore protocol, never as an import.
RAFT_THIRD_PARTY = frozenset({"pysyncobj", "crc32c"})


def outside_raft_allowlist(module: str) -> bool:
    """Whether raft/ may not import `module`: not stdlib, not raft, not RAFT_THIRD_PARTY."""
    top = module.split(".")[0]
    return top not in sys.stdlib_module_names and top not in RAFT_THIRD_PARTY | {"raft"}


def test_raft_imports_only_pysyncobj_crc32c_the_stdlib_and_itself() -> None:
    # An allowlist, unlike RULES' denylists: a new layer or library is refused by default.
    assert not outside_raft_allowlist("os.path") and not outside_raft_allowlist("raft.node")
    assert outside_raft_allowlist("log.segment") and outside_raft_allowlist("aiohttp")
    found = package_imports("raft")
    assert {imp.module.split(".")[0] for imp in found} >= {"pysyncobj", "crc32c", "raft"}
    violations = [
        f"{imp.path}:{imp.line}: imports {imp.module}"
        for imp in found
        if outside_raft_allowlist(imp.module) and (imp.path, imp.module) not in ALLOWED
    ]
    assert not violations, (
        "raft/ is consensus only: it imports pysyncobj, crc32c, the standard library and "
        "itself; state machines plug in through apply/snapshot/restore:\n" + "\n".join(violations)
    )
