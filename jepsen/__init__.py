"""Fault injection and consistency checking for dmq (README.md): real brokers, HTTP only."""
