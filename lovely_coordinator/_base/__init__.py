"""The ground floor every wing stands on: the error tree, value types and argument rules,
validated configuration, the event-loop services for synchronous code, the one wait
mechanism, process-wide shared objects, the outcomes lanes and turns share, and the tiny
JSON endpoint. Nothing here imports from a wing."""
