"""Every process bench/ starts runs the code of the tree bench/ was imported from, not of
the caller's working directory (which `python -m` and `python -c` put first on sys.path):
run from a directory holding decoy `dmq` and `raft` packages, bench/tree.py's
`start_python`, the brokers of `cluster_bench`, the broker of `broker_bench` (given a
relative data directory) and the demo nodes of `raft_bench` all run the real ones, so an
A/B of two trees compares the two."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import broker_bench, cluster_bench, raft_bench
from bench.loopback import common_free_port
from bench.tree import TREE_ROOT, start_python

REPO_ROOT = Path(__file__).resolve().parents[2]
WHICH_DMQ = ["-c", "import dmq; print(dmq.__file__)"]
DECOY_MARK = "decoy dmq"


@pytest.fixture
def decoy_cwd(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh working directory whose `dmq` and `raft.demo` only say they are decoys and
    exit (removed after)."""
    with tempfile.TemporaryDirectory(prefix="dmq-decoy-") as tmp:
        decoy = Path(tmp).resolve()
        for package, main in (("dmq", "__main__.py"), ("raft", "demo.py")):
            (decoy / package).mkdir()
            (decoy / package / "__init__.py").write_text("")
            (decoy / package / main).write_text(f"print({DECOY_MARK!r})\n")
        monkeypatch.chdir(decoy)
        yield decoy


def test_the_decoy_wins_in_a_child_started_from_its_directory(decoy_cwd: Path) -> None:
    # The control: without bench/tree.py, a child started here imports the decoy.
    out = subprocess.run([sys.executable, *WHICH_DMQ], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).is_relative_to(decoy_cwd), out.stdout


def test_start_python_imports_the_tree_of_bench(decoy_cwd: Path) -> None:
    assert TREE_ROOT == REPO_ROOT
    proc = start_python(WHICH_DMQ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    imported = Path(stdout.strip())
    assert imported.is_relative_to(REPO_ROOT / "dmq"), imported
    assert not imported.is_relative_to(decoy_cwd), imported


def test_cluster_bench_brokers_run_the_tree_of_bench(decoy_cwd: Path) -> None:
    log_path = decoy_cwd / "broker.log"
    proc = cluster_bench._spawn(["--help"], log_path)  # `dmq serve --help`
    assert proc.wait(60) == 0, cluster_bench.log_tail(log_path)
    log = log_path.read_text()
    assert DECOY_MARK not in log
    assert "--data-dir" in log, log  # the real `dmq serve`'s usage


def test_broker_bench_broker_runs_the_tree_of_bench_in_a_relative_data_dir(
    decoy_cwd: Path,
) -> None:
    with broker_bench.Server(Path("data")) as server:
        with urllib.request.urlopen(server.url + "/readyz", timeout=5) as response:  # noqa: S310 - http://127.0.0.1
            assert response.status == 200
        assert server.data_dir == decoy_cwd / "data"
        assert any(server.data_dir.iterdir())  # the broker wrote where the caller meant
    assert server.proc is not None and server.proc.returncode is not None


def test_raft_bench_nodes_run_the_tree_of_bench(decoy_cwd: Path) -> None:
    port = common_free_port(["127.0.0.11"])
    args = ["--node-id", "n1", "--peers", f"n1=127.0.0.11:{port}",
            "--data-dir", str(decoy_cwd / "n1"), "--no-values"]  # fmt: skip
    node = raft_bench.Node(args, decoy_cwd / "n1.log")  # the decoy never says "ready"
    try:
        assert "is_leader" in node.request("state", values=False)  # the real demo answers
    finally:
        node.stop()
    assert DECOY_MARK not in (decoy_cwd / "n1.log").read_text()
