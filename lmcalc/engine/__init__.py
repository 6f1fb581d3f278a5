"""The accounting engine: pure functions of specs that return result objects. No printing, no torch."""
