"""Tests of lovely_coordinator_dev.demo: the demo's parts."""
