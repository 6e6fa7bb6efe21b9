"""Engines (embedded transformers+peft; vLLM), adapter registry with hot-swap, the team chat API, tracing."""
