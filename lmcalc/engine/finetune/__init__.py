"""What is trained and where its states live: the fine-tuning method (full, LoRA, QLoRA, frozen layers), its
FLOPs, and offloading to the host or NVMe."""
