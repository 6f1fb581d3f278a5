"""Time of a step: kernel rates, collectives, a micro-batch's kernels, the pipeline, and their terms."""
