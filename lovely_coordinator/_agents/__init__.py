"""The agent coordinator (CONTRACT §1, §5, §9): the pure scheduler and its data, the
handles it gives out (permits, reservations, model requests), its clock and timer, what it
publishes (statistics, waiters, events, instruments, updates), and the process-global
coordinators."""
