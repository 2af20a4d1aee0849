"""Tests of lovely_coordinator/_agents: the agent coordinator and its scheduler."""
