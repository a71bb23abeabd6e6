"""kvlab.kernels."""
