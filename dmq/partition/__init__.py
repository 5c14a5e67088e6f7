"""A partition: its replicated state machine over log/ and the replica the broker runs.

`machine` applies produce commands to a `log.PartitionLog` (one per partition Raft group);
`producers` is the idempotent producers' per-partition state; `replica` is the broker's
handle on one partition's Raft group and log. See dmq/README.md.
"""
