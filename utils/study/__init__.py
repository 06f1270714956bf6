"""Studies: many runs per encoding, their statistics and reports."""
