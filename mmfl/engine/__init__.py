"""The round loop, messages, client-state store, checkpoints and transports."""
