"""A whole run: days and cost from FLOPs, energy and emissions, compute-optimal sizes."""
