"""`dmq bench auth` (`python -m bench.auth_bench`): produce with `--auth on` against off.

Two brokers (`--nodes` 1; or two 3-node clusters) of real `dmq serve` processes run side by
side on loopback, one with `--auth off` and one with `--auth on`. On the second, the
client is an ordinary user (not the superuser: its requests go through the ACL check and
the quota lookup) holding write on the topics and describe on the cluster, and sends its
bearer token with every request; its credential is verified by scrypt once, then found in
the broker's credential cache (dmq/broker/security.py). Runs alternate between the two.

Two shapes, because authentication costs per request, not per byte:

- batched: `--total-mb` of ready binary RecordBatches of 1,000 1 KiB records, acks=all,
  4 in flight (what a batching producer does): MB/s;
- small: `--requests` JSON produce requests of one 100-byte record each, acks=all,
  `--in-flight` (8) at once: requests/s.

Printed: the medians of `--runs` (3) of each mode and shape, the ratios auth/off, the cost
of one uncached verification (scrypt with the broker's parameters, median of 5), the
in-process cost per request of a cached credential's check (header, cache, one ACL among
101, quota lookup), the setup and the load average. The brokers and this client share the machine's cores: say so next
to any figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import aiohttp

from bench import main_of
from bench.cluster_bench import Broker, create_topic, dmq_cluster, post_batch, wait_leader
from bench.tls_bench import _batches
from dmq.broker.security import SCRYPT_N, SCRYPT_P, SCRYPT_R, SecurityService, derive_key
from dmq.config import BrokerConfig
from dmq.metadata.state import AclBinding, MetadataState, SecurityState, UserCredential

SUPERUSER = "bench-superuser-token-0123456789"
USER, PASSWORD = "bencher", "bench-password-1"


@contextlib.contextmanager
def _superuser_env() -> Iterator[None]:
    """DMQ_SUPERUSER_TOKEN for the brokers spawned inside (they inherit the environment)."""
    before = os.environ.get("DMQ_SUPERUSER_TOKEN")
    os.environ["DMQ_SUPERUSER_TOKEN"] = SUPERUSER
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("DMQ_SUPERUSER_TOKEN", None)
        else:
            os.environ["DMQ_SUPERUSER_TOKEN"] = before


async def _provision(url: str) -> None:
    """The bench's user: write on topics bench-*, describe on the cluster (leader lookup)."""
    headers = {"Authorization": f"Bearer {SUPERUSER}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.post(
            f"{url}/v1/auth/users", json={"name": USER, "password": PASSWORD}
        ) as r:
            assert r.status == 201, await r.text()
        for acl in (
            {"resource_type": "topic", "pattern": "prefixed", "resource_name": "bench-",
             "operation": "all"},
            {"resource_type": "cluster", "operation": "describe"},
        ):  # fmt: skip
            async with session.post(f"{url}/v1/acls", json={"principal": f"User:{USER}", **acl}):
                pass


async def _one_run(
    brokers: list[Broker], topic: str, batches: list[bytes], requests: int, in_flight: int,
    token: str | None,
) -> tuple[float, float]:  # fmt: skip
    """(batched MB/s, small requests/s) of one run."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:
        await create_topic(session, brokers[0].url, topic, 1, len(brokers))
        leader = await wait_leader(session, brokers, topic)
        await post_batch(session, leader.url, topic, batches[0])  # warm (and verify once)
        queue = list(batches[1:])

        async def batch_worker() -> None:
            while queue:
                await post_batch(session, leader.url, topic, queue.pop())

        start = time.perf_counter()
        await asyncio.gather(*(batch_worker() for _ in range(4)))
        mb_s = sum(map(len, batches[1:])) / (time.perf_counter() - start) / 1e6
        left = [requests]
        body = json.dumps({"records": [{"value": "x" * 100}]})
        url = f"{leader.url}/v1/topics/{topic}/records?partition=0&acks=all"

        async def small_worker() -> None:
            while left[0] > 0:
                left[0] -= 1
                async with session.post(
                    url, data=body, headers={"Content-Type": "application/json"}
                ) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"produce: {r.status}")

        start = time.perf_counter()
        await asyncio.gather(*(small_worker() for _ in range(in_flight)))
        requests_s = requests / (time.perf_counter() - start)
    return mb_s, requests_s


def _verify_ms() -> float:
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        derive_key(PASSWORD, b"0123456789abcdef", SCRYPT_N, SCRYPT_R, SCRYPT_P)
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def _cached_check_us() -> float:
    """In-process cost of what the middleware does per request once the credential is
    cached: parse the header, find it in the cache, check one ACL, the quota lookup
    (median of 5 rounds of 2,000; no HTTP, no other process: steadier than the MB/s)."""
    salt = b"0123456789abcdef"
    key = derive_key(PASSWORD, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    acls = tuple(
        AclBinding(f"User:u{k}", "topic", "prefixed", f"t{k}-", "write", "allow")
        for k in range(100)
    ) + (AclBinding(f"User:{USER}", "topic", "prefixed", "bench-", "all", "allow"),)
    users = {USER: UserCredential(salt.hex(), key.hex(), SCRYPT_N, SCRYPT_R, SCRYPT_P, 0)}
    state = MetadataState(security=SecurityState(users, tuple(sorted(acls))))
    config = BrokerConfig(auth="on")
    ctx = cast(Any, SimpleNamespace(config=config, metadata=SimpleNamespace(state=state)))
    service = SecurityService(ctx)
    header = f"Bearer {USER}:{PASSWORD}"

    async def rounds() -> list[float]:
        await service.authenticate(header)  # the one scrypt
        out = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(2000):
                principal = await service.authenticate(header)
                service.check(principal, "topic", "bench-1", "write")
                service.charge_request(principal, 100)
            out.append((time.perf_counter() - start) / 2000 * 1e6)
        return out

    return statistics.median(asyncio.run(rounds()))


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.quick:  # CI: one small run of each mode
        args.runs, args.total_mb, args.requests = 1, 4.0, 200
    batches = _batches(args.total_mb, seed=1)
    mb_s: dict[str, list[float]] = {"off": [], "on": []}
    requests_s: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        work = Path(tmp)
        with (
            dmq_cluster(work / "off", args.nodes, args.durability) as off,
            _superuser_env(),
            dmq_cluster(work / "on", args.nodes, args.durability, extra_args=["--auth", "on"]) as on,
        ):  # fmt: skip
            asyncio.run(_provision(on[0].url))
            clusters = {"off": (off, None), "on": (on, f"{USER}:{PASSWORD}")}
            for run_index in range(args.runs):
                for mode in ("off", "on") if run_index % 2 == 0 else ("on", "off"):
                    brokers, token = clusters[mode]
                    got = asyncio.run(
                        _one_run(brokers, f"bench-{run_index}", batches, args.requests,
                                 args.in_flight, token)
                    )  # fmt: skip
                    mb_s[mode].append(got[0])
                    requests_s[mode].append(got[1])
    med = {f"{k}_{m}": statistics.median(v[m]) for k, v in
           (("mb_s", mb_s), ("requests_s", requests_s)) for m in ("off", "on")}  # fmt: skip
    result: dict[str, Any] = {
        "setup": f"{args.nodes} broker(s) per cluster and the client share this machine's "
        f"cores ({os.cpu_count()}); batched: 1 KiB records, 1000-record batches, 4 in flight; "
        f"small: one 100 B record per request, {args.in_flight} in flight; acks=all, raft "
        f"durability {args.durability}; auth on: a user with ACLs, bearer token, cached",
        "nodes": args.nodes,
        "batched_produce_mb_s_off_median": med["mb_s_off"],
        "batched_produce_mb_s_on_median": med["mb_s_on"],
        "batched_on_over_off": med["mb_s_on"] / med["mb_s_off"],
        "small_produce_requests_s_off_median": med["requests_s_off"],
        "small_produce_requests_s_on_median": med["requests_s_on"],
        "small_on_over_off": med["requests_s_on"] / med["requests_s_off"],
        "uncached_verification_ms_median": _verify_ms(),
        "cached_check_us_per_request_median": _cached_check_us(),  # 101 ACLs, in-process
        "runs": args.runs,
        "total_mb": args.total_mb,
        "requests": args.requests,
        "load_average": os.getloadavg(),
    }
    print(json.dumps(result, indent=2))
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", help="create the work directory inside DIR")
    parser.add_argument("--nodes", type=int, default=1, help="brokers per cluster (1; or 3)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each mode (3)")
    parser.add_argument("--total-mb", type=float, default=32.0, help="batched MB per run (32)")
    parser.add_argument("--requests", type=int, default=2000, help="small requests per run")
    parser.add_argument("--in-flight", type=int, default=8, help="small requests at once (8)")
    parser.add_argument(
        "--durability", default="fsync", choices=("fsync", "none"), help="raft durability"
    )
    parser.add_argument("--quick", action="store_true", help="one small run of each (CI)")


main = main_of(__doc__, add_arguments, run)

if __name__ == "__main__":
    raise SystemExit(main())
