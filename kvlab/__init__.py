"""kvlab: a laboratory for KV-cache memory management in LLM inference."""

__version__ = "0.1.0"
