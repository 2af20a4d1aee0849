"""Tests of the dev distribution, lovely_coordinator_dev (dev/lovely_coordinator_dev)."""
