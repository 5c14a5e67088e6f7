"""The metadata catalogue: its replicated state machine and the service the broker uses.

`machine` is the state machine group 0 applies (brokers, topics and placement, reassignment,
voters, producers, consumer groups); `service` is the broker's side of it (propose, read,
follow as an observer). See dmq/README.md.
"""
