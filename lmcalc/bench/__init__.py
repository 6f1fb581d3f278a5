"""``lmcalc bench``: what the hardware really delivers, measured with PyTorch. torch is imported here only."""
