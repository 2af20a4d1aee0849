"""Turn queues (CONTRACT §3): one turn per conversation — the pure state machine, one
turn's job and outcome, the lease across replicas, and the async registry."""
