"""The metadata catalogue: its replicated state machine and the service the broker uses.

The catalogue is a set of domains (brokers, topics, reassignment, voters, producers,
consumer groups) registered with a small machine shell; `machine` is the state machine
group 0 applies, as the rest of dmq imports it; `service` is the broker's side of it
(propose, read, follow as an observer). See dmq/metadata/README.md.

This file imports nothing on purpose: a package __init__ that imported the domains would
load them whenever any submodule is imported, and make circles easy to close.
"""
