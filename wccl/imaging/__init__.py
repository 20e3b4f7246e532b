"""Finding and reading codes in camera images (pure functions over numpy arrays)."""
