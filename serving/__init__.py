"""The team chat API: adapter registry with hot-loaded versions, conversations and their threads, tracing
and the span store, the admin API (the engines it serves on: engines/)."""
