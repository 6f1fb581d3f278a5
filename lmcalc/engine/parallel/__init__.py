"""The parallel layout: its degrees, the pipeline's stages, how each tensor and state is sharded."""
