"""Launch configs read into lmcalc's settings (``--from``): Megatron-LM's arguments, a DeepSpeed JSON, a torchtitan
TOML, Hugging Face ``TrainingArguments``, an axolotl or a LLaMA-Factory YAML. ``read`` finds the kind (or takes it
named), and the kind's reader says what it took, what it cannot express, and what it left alone (``Launch``)."""

from lmcalc.launch.config import KINDS, Launch, Taken, Unexpressed
from lmcalc.launch.files import read

__all__ = ["KINDS", "Launch", "Taken", "Unexpressed", "read"]
