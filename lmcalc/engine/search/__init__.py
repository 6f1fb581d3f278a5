"""Searches that ask memory and time: the best layout (plan), what fits (fit), the largest model."""
