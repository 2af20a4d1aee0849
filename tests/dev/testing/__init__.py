"""Tests of lovely_coordinator_dev.testing: the helpers the test suites share."""
