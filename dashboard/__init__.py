"""kvlab.dashboard."""
