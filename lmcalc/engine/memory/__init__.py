"""Memory per GPU: what is saved for backward, the model states, the step's peak, and their terms."""
