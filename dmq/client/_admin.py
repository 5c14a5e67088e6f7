"""AsyncAdmin: topics, offsets and the cluster, one HTTP/JSON call each.

Failed calls raise the `dmq.errors` class the broker named (TopicNotFound,
TopicAlreadyExists, InvalidConfig, ...). Retriable errors are retried like every request
(`_http.py`), each call until its default_api_timeout_ms (60 s by default) has passed; note that a create or delete retried after a lost answer may then report
TopicAlreadyExists or TopicNotFound for the change it made itself.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from dmq.client import _limits
from dmq.client._http import Transport, group_path, topic_path
from dmq.client._parse import (
    parse_cluster,
    parse_description,
    parse_offsets,
    parse_topic_list,
)
from dmq.client._types import ClusterInfo, PartitionOffsets, TopicDescription, TopicSummary


class AsyncAdmin:
    """Administers one broker (or cluster) at `url`. `async with AsyncAdmin(url) as admin:`."""

    def __init__(
        self,
        url: str,
        *,
        retries: int | None = _limits.RETRIES_DEFAULT,
        retry_backoff_ms: int = _limits.RETRY_BACKOFF_MS_DEFAULT,
        request_timeout_ms: int = _limits.REQUEST_TIMEOUT_MS_DEFAULT,
        default_api_timeout_ms: int = _limits.DEFAULT_API_TIMEOUT_MS_DEFAULT,
        tls: ssl.SSLContext | None = None,
        token: str | None = None,
    ) -> None:
        self._transport = Transport(
            url,
            request_timeout_ms=request_timeout_ms,
            retries=retries,
            retry_backoff_ms=retry_backoff_ms,
            api_timeout_ms=default_api_timeout_ms,
            tls=tls,
            token=token,
        )

    @property
    def url(self) -> str:
        return self._transport.url

    async def __aenter__(self) -> AsyncAdmin:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._transport.close()

    async def create_topic(
        self,
        name: str,
        partitions: int | None = None,
        replication_factor: int | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> TopicDescription:
        """Create a topic; unset arguments take the broker's defaults."""
        body: dict[str, Any] = {"name": name}
        if partitions is not None:
            body["partitions"] = partitions
        if replication_factor is not None:
            body["replication_factor"] = replication_factor
        if config:
            body["config"] = dict(config)
        response = await self._transport.request("POST", "/v1/topics", json_body=body)
        return parse_description(response.json())

    async def list_topics(self) -> list[TopicSummary]:
        response = await self._transport.request("GET", "/v1/topics")
        return parse_topic_list(response.json())

    async def describe_topic(self, name: str) -> TopicDescription:
        """Config and per-partition offsets of one topic."""
        response = await self._transport.request("GET", topic_path(name))
        return parse_description(response.json())

    async def alter_config(self, name: str, config: Mapping[str, Any]) -> TopicDescription:
        """Set the given config keys (others keep their values); unknown keys are refused."""
        response = await self._transport.request(
            "PATCH", topic_path(name) + "/config", json_body={"config": dict(config)}
        )
        return parse_description(response.json())

    async def add_partitions(self, name: str, count: int) -> TopicDescription:
        """Grow the topic to `count` partitions in total (more than it has now).

        Keys then map to other partitions (murmur2 modulo the new count), as in Kafka.
        """
        response = await self._transport.request(
            "POST", topic_path(name) + "/partitions", json_body={"count": count}
        )
        return parse_description(response.json())

    async def delete_topic(self, name: str) -> None:
        """Delete a topic and all its data."""
        await self._transport.request("DELETE", topic_path(name))

    async def offsets(
        self, topic: str, partition: int, timestamp_ms: int | None = None
    ) -> PartitionOffsets:
        """log_start_offset and high_watermark of a partition; with `timestamp_ms`, also
        the first offset whose record is at least that recent (None if none is)."""
        params = {} if timestamp_ms is None else {"timestamp": str(int(timestamp_ms))}
        response = await self._transport.request(
            "GET", f"{topic_path(topic)}/partitions/{int(partition)}/offsets", params=params
        )
        return parse_offsets(response.json(), topic)

    # Consumer groups: the broker's JSON as it is (http_api/README.md, "Consumer groups").

    async def list_groups(self) -> list[dict[str, Any]]:
        response = await self._transport.request("GET", "/v1/groups")
        groups: list[dict[str, Any]] = response.json()["groups"]
        return groups

    async def describe_group(self, group: str) -> dict[str, Any]:
        """Members, their assignment, and per partition committed offset, high watermark, lag."""
        response = await self._transport.request("GET", group_path(group))
        doc: dict[str, Any] = response.json()
        return doc

    async def reset_group_offsets(
        self,
        group: str,
        to: str | int | list[tuple[str, int, int]],
        topics: list[str] | None = None,
    ) -> list[tuple[str, int, int]]:
        """Reset an empty group's offsets: to "earliest", "latest", a timestamp (ms) for every
        partition of `topics`, or to the given (topic, partition, offset) triples."""
        body: dict[str, Any]
        if isinstance(to, list):
            body = {
                "to": {"offsets": [{"topic": t, "partition": p, "offset": o} for t, p, o in to]}
            }
        else:
            body = {"to": {"timestamp": to} if isinstance(to, int) else to, "topics": topics or []}
        path = group_path(group) + "/offsets/reset"
        response = await self._transport.request("POST", path, json_body=body)
        return [(o["topic"], o["partition"], o["offset"]) for o in response.json()["offsets"]]

    async def delete_group(self, group: str) -> None:
        """Delete an empty group and its committed offsets (GroupNotEmpty while it has
        members, GroupNotFound if there is none)."""
        await self._transport.request("DELETE", group_path(group))

    async def cluster(self) -> ClusterInfo:
        response = await self._transport.request("GET", "/v1/cluster")
        return parse_cluster(response.json())

    async def operations(self) -> dict[str, Any]:
        """Running reassignments (with progress) and decommissions (GET
        /v1/cluster/operations)."""
        response = await self._transport.request("GET", "/v1/cluster/operations")
        doc: dict[str, Any] = response.json()
        return doc

    async def reassign(self, topic: str, partition: int, replicas: list[str]) -> dict[str, Any]:
        """Move a partition to `replicas` (preferred leader first); returns the operation."""
        body = {"topic": topic, "partition": int(partition), "replicas": list(replicas)}
        response = await self._transport.request(
            "POST", "/v1/cluster/reassignments", json_body=body
        )
        doc: dict[str, Any] = response.json()
        return doc

    async def decommission_partition(self, topic: str, partition: int) -> dict[str, Any]:
        """Stop the partition taking new records; it goes once retention empties it."""
        path = f"{topic_path(topic)}/partitions/{int(partition)}/decommission"
        response = await self._transport.request("POST", path)
        doc: dict[str, Any] = response.json()
        return doc

    async def change_metadata_voters(self, voters: list[str]) -> dict[str, Any]:
        """Change the metadata group's voters to `voters`; returns the operation."""
        response = await self._transport.request(
            "POST", "/v1/cluster/metadata-voters", json_body={"voters": list(voters)}
        )
        doc: dict[str, Any] = response.json()
        return doc

    async def features(self) -> dict[str, Any]:
        """Each broker's supported feature levels and release, and the cluster's finalized
        level (GET /v1/cluster/features)."""
        response = await self._transport.request("GET", "/v1/cluster/features")
        doc: dict[str, Any] = response.json()
        return doc

    async def finalize_features(self, level: int | None = None) -> dict[str, Any]:
        """Raise the finalized feature level (None: the highest the answering broker supports);
        FeatureLevelUnsupported naming the laggards otherwise. Not reversible."""
        body = {} if level is None else {"level": level}
        response = await self._transport.request(
            "POST", "/v1/cluster/features/finalize", json_body=body
        )
        doc: dict[str, Any] = response.json()
        return doc

    async def decommission_broker(self, broker_id: str) -> dict[str, Any]:
        """Move every replica off `broker_id`, then remove it from the cluster."""
        path = f"/v1/cluster/brokers/{quote(broker_id, safe='')}/decommission"
        response = await self._transport.request("POST", path)
        doc: dict[str, Any] = response.json()
        return doc

    async def cluster_status(self) -> dict[str, Any]:
        """Brokers, and per Raft group its leader, term, commit index and replica lag
        (the JSON of GET /v1/cluster/status, see http_api/README.md)."""
        response = await self._transport.request("GET", "/v1/cluster/status")
        status: dict[str, Any] = response.json()
        return status

    async def set_aside(self) -> dict[str, Any]:
        """The partition data the answering broker set aside (stray: unknown to its
        cluster's catalogue), never opened nor deleted (GET /v1/storage/set-aside)."""
        response = await self._transport.request("GET", "/v1/storage/set-aside")
        doc: dict[str, Any] = response.json()
        return doc

    # --- users, ACLs, quotas (brokers with --auth on; http_api/auth.py) -------------------

    async def whoami(self) -> dict[str, Any]:
        """The principal this client's token authenticates as (GET /v1/auth/whoami)."""
        return await self._json("GET", "/v1/auth/whoami")

    async def add_user(self, name: str, password: str | None = None) -> dict[str, Any]:
        """Create a user or replace its password; without one the broker generates it
        and answers it once, as `token` ("name:password")."""
        body: dict[str, Any] = {"name": name}
        if password is not None:
            body["password"] = password
        return await self._json("POST", "/v1/auth/users", body)

    async def remove_user(self, name: str) -> None:
        await self._json("DELETE", f"/v1/auth/users/{quote(name, safe='')}")

    async def list_users(self) -> list[dict[str, Any]]:
        users: list[dict[str, Any]] = (await self._json("GET", "/v1/auth/users"))["users"]
        return users

    async def add_acl(self, binding: Mapping[str, str]) -> dict[str, Any]:
        """One ACL binding: principal, resource_type, resource_name, operation, and
        pattern (literal) and permission (allow) if not the defaults."""
        return await self._json("POST", "/v1/acls", dict(binding))

    async def remove_acl(self, binding: Mapping[str, str]) -> None:
        await self._json("DELETE", "/v1/acls", dict(binding))

    async def list_acls(
        self, principal: str | None = None, resource_type: str | None = None
    ) -> list[dict[str, Any]]:
        params = {k: v for k, v in (("principal", principal), ("resource_type", resource_type))
                  if v is not None}  # fmt: skip
        acls: list[dict[str, Any]] = (await self._json("GET", "/v1/acls", params=params))["acls"]
        return acls

    async def set_quota(self, principal: str, rates: Mapping[str, int]) -> dict[str, Any]:
        """produce_bytes_per_s, fetch_bytes_per_s, requests_per_s (0 or absent: none)."""
        return await self._json("POST", "/v1/quotas", {"principal": principal, **rates})

    async def list_quotas(self) -> list[dict[str, Any]]:
        quotas: list[dict[str, Any]] = (await self._json("GET", "/v1/quotas"))["quotas"]
        return quotas

    async def _json(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        response = await self._transport.request(method, path, json_body=body, params=params)
        doc: dict[str, Any] = response.json()
        return doc
