"""Model accounting: a model's parameters tensor by tensor, its FLOPs, and the number formats."""
