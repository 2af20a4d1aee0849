"""Tests of lovely_coordinator/_base: the pieces every wing stands on."""
