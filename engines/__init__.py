"""Engines: the embedded transformers+peft engine, the vLLM client, launcher, adapters and replicas, model
references and devices. Used alike by the chat API (serving/) and the trainer (training/); this area
imports only graphs (the engine protocol) below it."""
