"""kvlab.policies."""
