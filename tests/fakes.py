"""The one place where tests replace something real: a scripted model at the engine edge.

``ScriptedEngine`` (from `gyre.engine.scripted`, where `gyre eval --agent oracle` uses it for scripted experts)
speaks the engine's HTTP API but answers with canned text instead of a model's sampling, for tests that need a
capable model (tool calls, a solved task) the tiny model cannot be.
"""

from gyre.engine.scripted import Script, ScriptedEngine

__all__ = ["Script", "ScriptedEngine"]
