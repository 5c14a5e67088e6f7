"""Proves the import rules that keep the catalogue's domains composable
(dmq/metadata/README.md, "Registry"), by reading each module of dmq/metadata/ with `ast`
(imports under `if TYPE_CHECKING:` count too):

- the foundation (state, codec, registry, placement) and the shell import no domain, nor
  the registration, the facade or the service;
- a domain imports the foundation only: never another domain, so none can close a circle
  and adding one touches no other;
- only the registration (catalogue.py) imports every domain, and nothing inside
  dmq/metadata/ but the service imports the facade (machine.py).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Final

import pytest

PACKAGE: Final = Path(__file__).resolve().parents[2] / "dmq" / "metadata"
FOUNDATION: Final = frozenset({"state", "codec", "registry", "placement"})
DOMAINS: Final = frozenset(
    {
        "brokers", "topics", "reassignment", "voters", "producers", "consumer_groups",
        "identity", "share_groups", "transactions", "security", "features",
    }
)  # fmt: skip
# module -> the dmq.metadata modules it may import
ALLOWED: Final = {
    **{name: FOUNDATION for name in FOUNDATION},
    "shell": FOUNDATION,
    **{name: FOUNDATION for name in DOMAINS},
    "catalogue": FOUNDATION | DOMAINS,
    "machine": FOUNDATION | DOMAINS | {"shell", "catalogue"},
    "service": frozenset({"machine"}),
}


def _metadata_imports(path: Path) -> set[str]:
    """The dmq.metadata modules `path` imports (by module or by `from dmq.metadata import m`)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            module = node.module
            names = (
                [f"{module}.{a.name}" for a in node.names] if module == "dmq.metadata" else [module]
            )
        else:
            continue
        found |= {n.split(".")[2] for n in names if n.startswith("dmq.metadata.")}
    return found


def test_every_module_has_a_rule() -> None:
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert modules == set(ALLOWED)


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_module_imports_only_what_its_layer_may(module: str) -> None:
    imported = _metadata_imports(PACKAGE / f"{module}.py") - {module}
    assert imported <= ALLOWED[module], sorted(imported - ALLOWED[module])


def test_the_package_init_imports_nothing_of_its_own() -> None:
    # Importing dmq.metadata.state must not load the domains (a runtime circle waiting).
    assert _metadata_imports(PACKAGE / "__init__.py") == set()
