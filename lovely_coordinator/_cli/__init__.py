"""The command line that ships with the library: ``top`` (``python -m lovely_coordinator``)."""
