"""Tests of lovely_coordinator/_cli: the command line's terminal views."""
