"""kvlab's policies inside other engines (layer 4): loaded by those engines' plugin loaders,
never imported by kvlab's core."""
