"""Agents: they talk to the model only through the router's OpenAI interface and act only through a sandbox."""
