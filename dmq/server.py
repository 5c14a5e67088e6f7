"""`dmq serve`: run one broker until SIGTERM or SIGINT; SIGHUP reloads the TLS files.

Lifecycle, one log line per event: starting, listening, stopping, stopped. On a
signal the listener closes, in-flight requests get `shutdown_grace_ms` to finish
(long-polls are woken and answered), every partition finishes its queued appends,
flushes and closes its files, and the data-directory lock is released.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import signal
import stat
import sys

from aiohttp import web

from dmq import __version__, errors
from dmq.broker import Broker
from dmq.config import BrokerConfig
from dmq.data_formats import check_data_dir
from dmq.listeners import bind_error
from dmq.malloc_tuning import keep_freed_memory
from dmq.selector import TAGS_CHARS_MAX
from http_api import log_redaction
from http_api.app import make_app

_log = logging.getLogger("dmq.server")
# One line, at start, for a broker of a multi-node cluster with no cluster secret.
UNSECURED_WARNING = (
    "NO CLUSTER SECRET: any process that reaches this broker's Raft port %s or its "
    "/v1/internal routes on %s is trusted as a broker of the cluster; keep both ports "
    "private, or give every broker --cluster-secret-file (dmq/README.md)"
)


EXPOSED_WARNING = (
    "%s %s is readable by group or others (mode %03o): anyone on this host who can read "
    "it can %s; chmod 600 it"
)
_EXPOSES = {
    "cluster_secret_file": "pass as a broker of the cluster",
    "tls_key": "pose as this broker over TLS",
}


def warn_if_exposed(config: BrokerConfig) -> list[str]:
    """Warn (one line each) about a cluster secret or TLS key file that users other than
    its owner may read; the names of those settings, for tests."""
    exposed = []
    for name, consequence in _EXPOSES.items():
        path = getattr(config, name)
        if not path:
            continue
        try:
            mode = os.stat(path).st_mode
        except OSError:
            continue  # reading it fails later with its own message
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            _log.warning(EXPOSED_WARNING, name, path, stat.S_IMODE(mode), consequence)
            exposed.append(name)
    return exposed


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


# aiohttp's default longest request line, bytes; run_broker raises it for tags= and filter=.
REQUEST_LINE_BYTES_MIN = 8190
# A character of a query parameter percent-encodes to at most 12 bytes (4 UTF-8 bytes, %XX).
ENCODED_CHAR_BYTES_MAX = 12


def request_line_bytes_max(config: BrokerConfig) -> int:
    """The longest request line dmq serve reads. aiohttp answers a longer one itself, in
    text/plain, so the line must hold the longest tags= and filter= the limits allow (a
    request with both is then a JSON 400 of ours), plus the path and the other parameters."""
    chars = config.filter_chars_max + TAGS_CHARS_MAX
    return max(REQUEST_LINE_BYTES_MIN, ENCODED_CHAR_BYTES_MAX * chars + 4096)


async def run_broker(config: BrokerConfig, stop: asyncio.Event) -> None:
    """Listen first, then join: a broker of a forming cluster must be reachable by the
    others (their internal routes) before it can itself finish starting."""
    broker = Broker(config)
    _log.info("starting broker %s (data dir %s)", config.node_id, config.data_dir)
    log_redaction.install()  # aiohttp quotes a malformed request's raw headers
    warn_if_exposed(config)
    runner = web.AppRunner(
        make_app(broker),
        shutdown_timeout=config.shutdown_grace_ms / 1000,
        access_log=None,
        max_line_size=request_line_bytes_max(config),
    )
    await runner.setup()
    loop = asyncio.get_running_loop()
    reloads: set[asyncio.Task[None]] = set()  # held until done (a task is weakly kept)
    if broker.tls is not None:

        def on_sighup() -> None:
            task = asyncio.ensure_future(_reload_tls(broker))
            reloads.add(task)
            task.add_done_callback(reloads.discard)

        loop.add_signal_handler(signal.SIGHUP, on_sighup)
    try:
        tls = broker.tls  # dmq/tls.py: None with TLS off
        site = web.TCPSite(
            runner,
            config.http_host,
            config.http_port,
            reuse_address=True,
            ssl_context=None if tls is None else tls.http_server,
        )
        try:
            await site.start()
        except OSError as exc:
            named = bind_error("HTTP", config.http_addr, "--http-addr", exc)
            if named is None:
                raise
            raise named from exc
        _log.info(
            "listening on %s://%s; raft on %s%s",
            config.http_scheme,
            config.http_addr,
            config.raft_addr,
            " (TLS)" if tls is not None else "",
        )
        starting = asyncio.ensure_future(broker.start())
        stopping = asyncio.ensure_future(stop.wait())
        failing = asyncio.ensure_future(broker.failed.wait())
        await asyncio.wait({starting, stopping, failing}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
        else:
            starting.result()  # a failed start raises here
            await asyncio.wait({stopping, failing}, return_when=asyncio.FIRST_COMPLETED)
        failing.cancel()
        stopping.cancel()
        _log.info("stopping: draining in-flight requests")
        broker.ready = False
    finally:
        if broker.tls is not None:
            loop.remove_signal_handler(signal.SIGHUP)
        # Close partitions first so parked long-polls wake and answer, then the server.
        await broker.stop()
        await runner.cleanup()
    if broker.failure is not None:
        raise errors.StorageError(f"the broker stopped on an error: {broker.failure!r}")
    _log.info("stopped")


async def _reload_tls(broker: Broker) -> None:
    """SIGHUP with TLS on: read tls_cert, tls_key and tls_ca again (dmq/tls.py). A file
    that cannot be read or does not match is logged and changes nothing."""
    try:
        await broker.reload_tls()
    except errors.DmqError as exc:
        _log.error("TLS reload refused, the running certificates stay: %s", exc)
    else:
        _log.info("TLS reloaded: new connections use %s", broker.config.tls_cert)


def raise_open_files_limit() -> int:
    """Lift the soft descriptor limit to the hard one (each partition replica holds about
    six files; see replicas_per_broker_max). Returns the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1_048_576)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def serve(config: BrokerConfig) -> int:
    configure_logging(config.log_level)
    if not keep_freed_memory():
        _log.info("malloc left as it is (MALLOC_*_ tunables set, or not glibc)")
    files = raise_open_files_limit()
    if files < 6 * config.replicas_per_broker_max + 1024:
        _log.warning(
            "the open files limit (%d) is below what %d replicas need (~%d): raise it "
            "(ulimit -n) or lower replicas_per_broker_max",
            files,
            config.replicas_per_broker_max,
            6 * config.replicas_per_broker_max + 1024,
        )

    if not config.cluster_secret_file and (len(config.peer_addrs) > 1 or config.join):
        _log.warning(UNSECURED_WARNING, config.raft_addr, config.http_addr)
    if config.auth == "on" and not config.tls_enabled:  # dmq/README.md, "Security"
        _log.warning("auth on without TLS: passwords and tokens cross the network in clear")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_broker(config, stop)

    _log.info("dmq %s starting", __version__)
    try:
        # A file newer than this release reads: refused before anything opens (and writes).
        check_data_dir(config.data_path)
        asyncio.run(main())
    except errors.DmqError as exc:  # could not start, or stopped on an error
        _log.error("exiting: %s (dmq %s)", exc, __version__)
        return 1
    except OSError as exc:
        _log.error("cannot start: %s", exc)
        return 1
    return 0
