"""``python -m lovely_coordinator demo``: the simulated fleet, and its run across processes."""
