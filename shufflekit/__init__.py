"""shufflekit package."""
