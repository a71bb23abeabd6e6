"""kvlab.sim."""
