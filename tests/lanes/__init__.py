"""Tests of lovely_coordinator/_lanes and the public module lovely_coordinator.lanes."""
