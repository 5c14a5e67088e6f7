"""The registration: which domains make up the metadata catalogue, in which order.

This is the only module that imports every domain; the shell (dmq/metadata/shell.py)
imports none, and no domain imports another. Adding a domain is a new module plus its line
in `CATALOGUE` (and its command union in `Command`, for type checkers): see
dmq/metadata/README.md, "How to add a domain".

The order is replicated behaviour: restore reads the domains' JSON in this order, and
after a change of the partition set the followers update in this order. Append new
domains at the end; never reorder.
"""

from __future__ import annotations

from typing import Final

from dmq.metadata import (
    brokers,
    consumer_groups,
    features,
    identity,
    producers,
    reassignment,
    security,
    share_groups,
    topics,
    transactions,
    voters,
)
from dmq.metadata.registry import Registry
from groups.commands import GroupCommand
from groups.share_commands import ShareCommand

CATALOGUE: Final = Registry(
    (
        brokers.DOMAIN,
        topics.DOMAIN,
        reassignment.DOMAIN,
        voters.DOMAIN,
        producers.DOMAIN,
        consumer_groups.DOMAIN,
        identity.DOMAIN,
        share_groups.DOMAIN,
        transactions.DOMAIN,
        security.DOMAIN,  # users, ACLs, quotas (appended: the order is replicated)
        features.DOMAIN,  # the finalized feature level
    )
)

# The catalogue's own commands, and every command the metadata group carries.
CatalogueCommand = (
    brokers.BrokerCommand
    | topics.TopicCommand
    | reassignment.ReassignmentCommand
    | voters.VotersCommand
    | producers.ProducerCommand
    | identity.IdentityCommand
    | transactions.TransactionCommand
    | security.SecurityCommand
    | features.FeaturesCommand
)
Command = CatalogueCommand | GroupCommand | ShareCommand
