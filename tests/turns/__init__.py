"""Tests of lovely_coordinator/_turns and the public module lovely_coordinator.turns."""
