"""Consumer groups: a pure, deterministic state machine (see README.md)."""
