"""Gyre's own inference engine: continuous batching, a token-granular prefix cache, SGLang's HTTP API."""
