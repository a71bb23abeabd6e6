"""Model implementations and configs for the real engine."""
