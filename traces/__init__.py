"""kvlab.traces."""
