"""Which broker serves what: topic views, partition leaders, brokers' HTTP addresses.

Every service asks here rather than reading the catalogue itself:

- `view` / `topic`: a catalogue topic as the request paths read it, built once per
  metadata version (a produce must not rebuild the active partitions per record);
- `leader_of`: the partition's leader as known here, the local replica's Raft view first,
  else the catalogue's last report (leaders are reported once a second, cluster.py);
- `serving_replica`: the replica that answers a read here, or `ForwardRequest` to the
  leader's broker (the HTTP layer relays it once, http_api/forward.py);
- `http_addr_of` / `voter_http_addrs` / `metadata_contact_addrs`: where another broker listens.
"""

from __future__ import annotations

import time

from dmq import errors, planted
from dmq.broker.context import BrokerContext
from dmq.broker.types import Consistency, ForwardRequest, TopicView
from dmq.metadata.machine import PARTITION_ACTIVE, PARTITION_GONE, MetadataState
from dmq.partition.replica import PartitionReplica
from raft import quiesce
from raft.node import Replica


class Routing:
    """Lookups over this broker's catalogue and replicas; no state but the views cache."""

    def __init__(self, ctx: BrokerContext) -> None:
        self._ctx = ctx
        self._views: dict[str, TopicView] = {}
        self._views_version = -1
        # The planted bug lease-read only: (topic, partition) -> when this broker's lease
        # on the partition's leadership runs out (time.monotonic() seconds).
        self._leases: dict[tuple[str, int], float] = {}

    def view(self, name: str) -> TopicView | None:
        state = self._ctx.metadata.state
        if state.metadata_version != self._views_version:
            self._views = {}
            self._views_version = state.metadata_version
        view = self._views.get(name)
        if view is None:
            info = state.topics.get(name)
            if info is None:
                return None
            view = TopicView(
                info.name,
                info.topic_id,
                len(info.partitions),
                info.replication_factor,
                dict(info.config),
                info,
                tuple(p for p, pl in enumerate(info.partitions) if pl.status == PARTITION_ACTIVE),
            )
            self._views[name] = view
        return view

    def topic(self, name: str) -> TopicView:
        """The topic, once the broker is ready; TopicNotFound if the catalogue has none."""
        self._ctx.check_ready()
        view = self.view(name)
        if view is None:
            raise errors.TopicNotFound(f"topic {name!r} does not exist", field="topic")
        return view

    def partition_count(self, name: str) -> int | None:
        """The topic's partition count in this broker's catalogue (None: no such topic)."""
        view = self.view(name) if self._ctx.metadata_service is not None else None
        return None if view is None else view.partitions

    @staticmethod
    def check_partition(topic: TopicView, partition: int) -> None:
        if not 0 <= partition < topic.partitions:
            raise errors.PartitionNotFound(
                f"topic {topic.name!r} has partitions 0..{topic.partitions - 1}, not {partition}",
                field="partition",
                limit=topic.partitions - 1,
            )
        if topic.info.partitions[partition].status == PARTITION_GONE:
            raise errors.PartitionGone(
                f"partition {partition} of {topic.name!r} was decommissioned and is gone "
                "(retention removed its records)",
                field="partition",
            )

    def leader_of(self, view: TopicView, partition: int) -> str | None:
        """The partition's leader as known here: the local replica's Raft view, else the
        catalogue's last report."""
        replica = self._ctx.replicas.get(view.name, partition)
        if replica is not None and replica.raft is not None:
            leader = replica.raft.status().leader_id
            if leader is not None:
                return leader
        return view.info.partitions[partition].leader

    def http_addr_of(self, node_id: str) -> str | None:
        info = self._ctx.metadata.state.brokers.get(node_id)
        return None if info is None else info.http_addr

    def node_at(self, http_addr: str) -> str:
        """The node id of the registered broker listening on `http_addr`, "" if none is
        known (yet): whom a signed call is for (dmq/internal_auth.py)."""
        metadata = self._ctx.metadata_service
        if metadata is None:
            return ""
        for node_id, info in metadata.state.brokers.items():
            if info.http_addr == http_addr:
                return node_id
        return ""

    def voter_http_addrs(self) -> list[str]:
        """The other voters' HTTP addresses: registered ones, else a guess for the first
        contact. The voters are the catalogue's (`MetadataState.voters`, recorded after
        each change of group 0), the configured `metadata_voters` only until the catalogue
        has any.

        An observer knows the voters' Raft addresses from `peers` but not their HTTP
        addresses until it has the catalogue: it first tries each voter's Raft host with
        this broker's own HTTP port (brokers usually share one port; see dmq/README.md).
        """
        metadata = self._ctx.metadata_service
        config = self._ctx.config
        state = metadata.state if metadata is not None else None
        voters = metadata.voters if metadata is not None else config.voters
        out = []
        for voter in voters:
            if voter == config.node_id:
                continue  # a broker asks the others (a promoting one is not served yet)
            addr = self._http_addr_or_guess(voter, state)
            if addr is not None:
                out.append(addr)
        return out

    def _http_addr_or_guess(self, node_id: str, state: MetadataState | None) -> str | None:
        """`node_id`'s registered HTTP address, else the one `peer_http_addrs` names
        (--join sets it from the cluster it asked), else its `--peers` Raft host with this
        broker's own HTTP port (a guess: brokers usually share one port; on one host they
        cannot, and the guess would name this broker itself), else None."""
        info = state.brokers.get(node_id) if state is not None else None
        if info is not None:
            return info.http_addr
        config = self._ctx.config
        known = config.peer_http_addr_map.get(node_id)
        if known is not None:
            return known
        if node_id in config.peer_addrs:
            host = config.peer_addrs[node_id].rpartition(":")[0]
            return f"{host}:{config.http_port}"
        return None

    def metadata_contact_addrs(self) -> list[str]:
        """Where the metadata service asks for the catalogue and sends its commands, in
        turn: the voters (`voter_http_addrs`), then every other registered broker, then
        every other broker `--peers` names. A catalogue this broker holds may name voters
        that have all left since (decommissioned, or demoted to observers); a broker that
        is not a voter refuses at once, so the next one is tried until a current voter
        answers and its catalogue names the voters again. A restarted observer has no
        catalogue yet: its configured voters may all have left, and only its peers lead
        it to the current ones (jepsen campaign seed 1129, run 5: two demoted voters,
        restarted, asked only their configured voters, one of them decommissioned, and
        never registered). Not for relaying group requests: those go to a voter."""
        out = self.voter_http_addrs()
        metadata = self._ctx.metadata_service
        if metadata is not None:
            state, me = metadata.state, self._ctx.config.node_id
            known = [b for b in sorted(state.brokers) if b != me]
            known += [p for p in self._ctx.config.peer_addrs if p != me and p not in known]
            for node_id in known:
                addr = self._http_addr_or_guess(node_id, state)
                if addr is not None and addr not in out:
                    out.append(addr)
        return out

    def serving_replica(
        self,
        topic: str,
        partition: int,
        forwarded: bool,
        consistency: Consistency = "linearizable",
    ) -> PartitionReplica:
        """The replica that answers a read here, or ForwardRequest to the leader's broker.

        Reads go to the partition leader (as Kafka's do), whose high watermark is the
        newest. consistency="linearizable": the caller then confirms the leadership
        (`PartitionReplica.read_barrier`, raft/read_index.py) before it reads.
        consistency="leader": only while its node heard from a majority lately, a
        heuristic that narrows the window in which a deposed leader that has not noticed
        answers stale reads, not a proof (dmq/README.md, "Read consistency"). A relayed
        request that lands on a broker that does not lead (the catalogue's leader report
        lags) is not relayed again: it gets NotLeader and the client retries. Answering it
        from a follower's replica, as before, answered stale reads (both found by jepsen/).
        A leader out of reach from here (`BrokerContext.out_of_reach`) gets NotLeader at
        once, and a relay is given up once its leader goes out of reach.
        """
        view = self.topic(topic)
        self.check_partition(view, partition)
        replica = self._ctx.replicas.local(topic, partition, view.topic_id)
        raft = None if replica is None else replica.raft
        status = None if raft is None else raft.status()
        if replica is not None and raft is not None and planted.active("lease-read"):
            if self._lease_read(topic, partition, raft):
                return replica
        elif replica is not None and raft is not None and status is not None and status.is_leader:
            # A new leader serves reads once its election no-op is applied (before, its
            # high watermark may lag what the previous leader acknowledged: found by
            # jepsen/ at leadership transfers during replica moves).
            if status.leader_ready and (
                consistency == "linearizable" or _majority_heard_lately(raft)
            ):
                # Its offsets as of that apply at least: a follower's mirror may lag (dmq/
                # partition/replica.py, FOLLOWER_MIRROR_INTERVAL_S) and a new leader's
                # first mirror may not have run yet.
                replica.refresh_offsets()
                return replica
        elif replica is not None and planted.active("stale-read"):
            return replica
        leader = self.leader_of(view, partition)
        addr = None if leader is None else self.http_addr_of(leader)
        if forwarded or addr is None or leader is None or leader == self._ctx.node_id:
            raise errors.NotLeader(
                f"partition {topic}-{partition} has no leader reachable from here yet",
                retry_after_ms=200,
            )
        if self._ctx.out_of_reach(leader):
            # A cut: the relay would wait out its timeout (a bridge partition keeps the
            # leader out of reach while it lasts); the client asks another broker.
            raise errors.NotLeader(
                f"partition {topic}-{partition}'s leader {leader} is out of reach from here "
                "(not heard from within an election timeout)",
                retry_after_ms=200,
            )
        raise ForwardRequest(addr, node_id=leader)

    def _lease_read(self, topic: str, partition: int, raft: Replica) -> bool:
        """The planted bug lease-read: a leader that heard from a majority takes a lease of
        two election timeouts (the step-down time dmq used before check-quorum) and
        answers every read while it lasts, without confirming: the others elect a new
        leader after one election timeout and acknowledge writes that this one, cut off,
        paused or stepped down meanwhile, does not show."""
        now = time.monotonic()
        status = raft.status()
        if status.is_leader and status.leader_ready and _majority_heard_lately(raft):
            lease_s = 2 * raft.node.config.election_timeout_max_s
            self._leases[(topic, partition)] = now + lease_s
        return now < self._leases.get((topic, partition), 0.0)


def _majority_heard_lately(raft: Replica) -> bool:
    """consistency="leader" (and the planted bug lease-read): a leader serves reads only while a majority of its group was heard from within half
    an election timeout, counted from no later than the end of the node's last Raft round:
    a leader cut off from the others (or paused, then resumed) keeps thinking it leads
    until a round processes the newer term, while the others have elected another and
    committed more, and would answer stale reads (found by jepsen/). Node-level
    liveness, not a per-group lease: it narrows that window, it does not prove it closed."""
    lease_s = raft.node.config.election_timeout_min_s / 2
    wake = quiesce.leader_wake_at(
        raft.node.network.last_heard, raft.followers, len(raft.members), lease_s
    )
    now = time.monotonic()
    return now < raft.node.round_done_at + lease_s and (wake is None or now < wake)
