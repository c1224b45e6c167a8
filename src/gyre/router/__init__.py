"""The OpenAI-compatible router."""
