"""The test suite (a package, so that test modules can share helper modules)."""
