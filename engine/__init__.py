"""kvlab.engine."""
