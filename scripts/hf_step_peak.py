"""Where a Hugging Face training step peaks: every storage PyTorch allocates in one step, as a timeline.

A harness for the tests and the docs (it imports torch and transformers; the package never does). For a
``hf_saved`` case it builds the model (random weights, bf16, train mode), runs one step the way ``Trainer`` does
(``loss = model(input_ids=..., labels=..., use_cache=False).loss``, the rest of the output dropped, then
``loss.backward()``), optionally with transformers' gradient checkpointing (non-reentrant) or PEFT's LoRA, and
records every storage an operator makes and the moment PyTorch frees it: a ``TorchDispatchMode`` that keeps a weak
reference to each new storage, the method of ``torch.distributed._tools.mem_tracker.MemTracker`` (and of
``lmcalc.measure.StorageTracker``), here writing an event log rather than counters.

Parameters and buffers exist before the step and are not in the log. The parameters' gradients are: they are found
once the backward has run (each ``.grad``'s storage, the one made last at its address) and left out when the log is
replayed, so the peak is of what is not model state (activations, autograd's gradients in flight, the loss's
temporaries), as lmcalc's activations plus its transients are. The replay names the phase the peak falls in (the
forward with the loss, or the backward), and how many operators into it.

``python scripts/hf_step_peak.py [--case NAME ...]`` prints the peaks.
"""

from __future__ import annotations

import argparse
import functools
import gc
import weakref
from dataclasses import dataclass
from typing import Any

import hf_saved
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode


class StorageLog(TorchDispatchMode):
    """Each storage an operator makes (its size, the phase, the operator's index) and when it is freed."""

    def __init__(self, resident: list[torch.Tensor], fp32_products: bool = True) -> None:
        """``resident``: tensors that exist before the step (parameters, buffers), whose views are not new;
        ``fp32_products``: bf16 matrix products computed in fp32 (``hf_saved.fp32_product``)."""
        super().__init__()
        self.fp32_products = fp32_products
        self._resident = hf_saved.PinnedStorages(resident)  # held: a buffer the forward replaces frees its address
        self.events: list[tuple[int, int]] = []  # (allocation id, +bytes or -bytes), in order
        self.phase_starts: dict[str, int] = {}  # phase -> index of its first event
        self._by_address: dict[int, tuple[int, weakref.ref]] = {}  # data_ptr -> (id, the storage's weak ref)
        self._next = 0
        self.made_by: list[str] = []  # allocation id -> the operator that made it
        self._op = ""
        self.gradient_chain: set[int] = set()  # ids of parameters' gradients in the making (``watch_gradients``)

    def phase(self, name: str) -> None:
        self.phase_starts[name] = len(self.events)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # a bf16 product in fp32 (10-100 times faster on a CPU without native bf16): made in this handler, its fp32
        # copies are not dispatched here, and the log sees the one bf16 output the bf16 kernel makes
        out = hf_saved.fp32_product(func, args, kwargs or {}) if self.fp32_products else func(*args, **(kwargs or {}))
        self._op = str(func)
        summed = self.gradient_chain and func is torch.ops.aten.add.Tensor  # a parameter's gradients summed
        if summed and any(self.ident_of(a) in self.gradient_chain for a in args if isinstance(a, torch.Tensor)):
            self._track(out.untyped_storage())
            self.gradient_chain.add(self.ident_of(out))  # type: ignore[arg-type]
            return out
        for tensor in pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and not isinstance(tensor, torch.nn.Parameter):
                self._track(tensor.untyped_storage())
        return out

    def _track(self, storage: torch.UntypedStorage) -> None:
        address = storage.data_ptr()
        known = self._by_address.get(address)
        if (known is not None and known[1]() is storage) or storage.nbytes() == 0 or address in self._resident:
            return  # a view (of a parameter too), an in-place result, or nothing
        ident, size = self._next, storage.nbytes()
        self._next += 1
        self.made_by.append(self._op)
        self._by_address[address] = (ident, weakref.ref(storage, functools.partial(self._free, ident, size)))
        self.events.append((ident, size))

    def _free(self, ident: int, size: int, _ref: weakref.ref) -> None:
        self.events.append((ident, -size))

    def ident_of(self, tensor: torch.Tensor) -> int | None:
        """The allocation id of ``tensor``'s storage, if this log saw it made."""
        known = self._by_address.get(tensor.untyped_storage().data_ptr())
        return known[0] if known is not None and known[1]() is tensor.untyped_storage() else None

    def watch_gradients(self, loss: torch.Tensor, parameters: set[torch.nn.Parameter]) -> None:
        """Note the gradients autograd makes for ``parameters`` before it hands them to ``.grad``: a weight used more
        than once in the graph (a looped model's layers) gets one from each use, which autograd sums in the buffer of
        its AccumulateGrad node, out of place, before ``.grad`` takes the sum; each node that makes one (its post hook
        runs before the sum) and each sum are the parameter's gradient, model state, not an activation."""
        seen, stack = set(), [loss.grad_fn]
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            slots = [i for i, (n, _) in enumerate(node.next_functions)
                     if n is not None and getattr(n, "variable", None) in parameters]  # fmt: skip
            if slots:

                def hook(grad_inputs: tuple, _outputs: tuple, _slots: list[int] = slots) -> None:
                    for i in _slots:
                        if grad_inputs[i] is not None and (ident := self.ident_of(grad_inputs[i])) is not None:
                            self.gradient_chain.add(ident)

                node.register_hook(hook)
            stack.extend(n for n, _ in node.next_functions)

    def live_at(self, index: int, leave_out: set[int]) -> dict[int, int]:
        """The allocations live just after event ``index``: id -> bytes."""
        live: dict[int, int] = {}
        for ident, size in self.events[: index + 1]:
            if ident in leave_out:
                continue
            if size > 0:
                live[ident] = size
            else:
                live.pop(ident, None)
        return live

    def peak(self, leave_out: set[int]) -> tuple[int, int]:
        """The most bytes live at once, and the index of the event that reached it, without ``leave_out``."""
        live = high = 0
        where = 0
        for index, (ident, size) in enumerate(self.events):
            if ident in leave_out:
                continue
            live += size
            if live > high:
                high, where = live, index
        return high, where


@dataclass(frozen=True)
class StepPeak:
    """The step's peak of what is not model state, and where it fell."""

    case: str
    seq_len: int
    micro_batch: int
    checkpointing: bool
    lora: bool
    peak: int  # bytes: activations, gradients in flight, temporaries; not parameters, buffers or .grad
    phase: str  # "forward" (with the loss) or "backward"
    gradients: int  # bytes of the parameters' gradients (left out of the peak)

    @property
    def label(self) -> str:
        how = ("LoRA " if self.lora else "") + ("checkpointed" if self.checkpointing else "plain")
        return f"{self.case} s={self.seq_len} b={self.micro_batch} {how}"


def measure(
    case_name: str,
    seq_len: int,
    micro_batch: int,
    checkpointing: bool,
    attention: str = "sdpa",
    lora: dict[str, Any] | None = None,
    dropout: float | None = None,
    fp32_adapters: bool = True,
    autocast: bool = False,
    fp32_products: bool = True,
    dtype: torch.dtype = torch.bfloat16,
    every_gradient: bool = False,
) -> StepPeak:
    """One Trainer-style step of ``case_name`` (with ``lora``: PEFT's LoRA, fp32 adapters as PEFT makes them),
    logged storage by storage; the peak of what is not model state. ``dropout``: GPT-2's (its config's 0.1 when
    None), as ``hf_saved.measure`` takes it; ``fp32_products``: bf16 matrix products computed in fp32 (the same
    storages logged: ``tests/test_hf_saved_products.py``); ``dtype``: the model's (xLSTM trains in fp32 alone);
    ``every_gradient``: leave out each gradient autograd makes for a parameter, not only the one ``.grad`` keeps
    (``StorageLog.watch_gradients``: a looped model's shared layers get one a run, summed before ``.grad``)."""
    model = hf_saved.build_model(case_name, attention, dtype, dropout=dropout)
    if lora is not None:
        model = hf_saved._with_lora(model, lora, fp32_adapters=fp32_adapters)
    if checkpointing:
        hf_saved._enable_checkpointing(model)
    torch.manual_seed(1)
    text = model.config.get_text_config()
    vocab = getattr(text, "unpadded_vocab_size", None) or text.vocab_size  # Inkling 2's head rows
    ids = torch.randint(0, vocab, (micro_batch, seq_len))
    images = hf_saved.image_inputs(hf_saved.CASES[case_name], model, micro_batch)  # GIT's pixels, made as the ids
    try:
        log = StorageLog([*model.parameters(), *model.buffers()], fp32_products)
        with log:
            log.phase("forward")
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):  # the Trainer's bf16=True
                loss = model(input_ids=ids, labels=ids, use_cache=False, **images).loss  # the rest dropped
            log.phase("backward")
            if every_gradient:
                log.watch_gradients(loss, {p for p in model.parameters() if p.requires_grad})
            loss.backward()
            del loss
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        leave_out = {i for i in (log.ident_of(g) for g in grads) if i is not None} | log.gradient_chain
        peak, where = log.peak(leave_out)
        phase = "backward" if where >= log.phase_starts["backward"] else "forward"
        return StepPeak(
            case_name,
            seq_len,
            micro_batch,
            checkpointing,
            lora is not None,
            peak,
            phase,
            sum(g.numel() * g.element_size() for g in grads),
        )
    finally:
        model.zero_grad(set_to_none=True)
        if checkpointing:
            hf_saved._disable_checkpointing(model)
        if lora is not None:
            hf_saved.release_models()  # the PEFT wrapper changed the cached model
        gc.collect()


LORA = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear"}
"""The LoRA the table measures: r 8 on every linear layer but the head, no dropout."""
LORA_MODES = {  # (PEFT's fp32 adapters, the Trainer's autocast, lmcalc's recipe)
    "bf16 adapters": (False, False, "bf16-pure"),
    "fp32 adapters": (True, False, "bf16-pure"),
    "fp32 adapters, autocast": (True, True, "bf16-mixed"),
}


def harness_workload(
    spec: Any, precision: Any, seq_len: int, micro_batch: int, checkpointing: bool, attention: str, method: Any
) -> Any:
    """The workload the harness's models run, as lmcalc sees it: the transformers profile, AdamW, the CPU's dropout
    masks, ``attention`` ("sdpa" or "eager") and transformers' gradient checkpointing (full recomputation) or none."""
    from lmcalc.engine.workload import Workload, dropout_mask_bytes
    from lmcalc.presets import framework_profile, resolve_optimizer

    return Workload(
        spec,
        precision,
        resolve_optimizer("adamw").spec,
        seq_len,
        micro_batch,
        "flash" if attention == "sdpa" else "eager",
        "full" if checkpointing else "none",
        mask_bytes=dropout_mask_bytes("cpu", precision),
        framework=framework_profile("transformers"),
        method=method,
    )


def lmcalc_peak(
    case_name: str,
    seq_len: int,
    micro_batch: int,
    checkpointing: bool,
    attention: str,
    lora_mode: str | None = None,
) -> tuple:
    """lmcalc's busiest phase beyond the model states for the same model (read from the very config the harness
    builds it from) under the transformers profile, on one device, fully trained or with ``LORA`` run as
    ``LORA_MODES[lora_mode]`` says: (bytes, the phase's name)."""
    from lmcalc.engine.finetune.method import FULL, Method, parse_targets
    from lmcalc.engine.memory.gpu_memory import gpu_memory
    from lmcalc.engine.memory.phases import step_phases
    from lmcalc.engine.parallel.layout import Layout
    from lmcalc.hf_config import model_from_hf_config
    from lmcalc.presets import resolve_precision
    from lmcalc.specs import ModelSpec

    case = hf_saved.CASES[case_name]
    config = case.config(0.0 if case.dropout_knobs else None)
    fields = model_from_hf_config(config.to_dict(), case_name, f"hf_saved.CASES[{case_name!r}]")
    if case.dropout_knobs:
        fields["dropout"] = False
    method, recipe = FULL, "bf16-pure"
    if lora_mode is not None:
        fp32_adapters, _, recipe = LORA_MODES[lora_mode]
        method = Method("lora", LORA["r"], parse_targets(LORA["target_modules"]), fp32_adapters=fp32_adapters)
    w = harness_workload(
        ModelSpec.model_validate(fields),
        resolve_precision(recipe).spec,
        seq_len,
        micro_batch,
        checkpointing,
        attention,
        method,
    )
    gpu = gpu_memory(w, Layout(), 0)
    phases = step_phases(gpu.held, gpu.transients, gpu.kept.step_transient)  # the gradients left out, as measured
    return phases.busiest, phases.binding


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", help="a hf_saved case (repeatable); default: a few")
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--lora", action="store_true", help=f"PEFT's LoRA ({LORA}) in each of {list(LORA_MODES)}")
    args = parser.parse_args(argv)
    modes: tuple[str | None, ...] = tuple(LORA_MODES) if args.lora else (None,)
    print("| model | how | checkpointing | measured peak (MiB) | lmcalc (MiB) | error | binding phase (lmcalc) |")
    print("|---|---|---|---:|---:|---:|---|")
    for name in args.case or ["llama-small", "qwen2-small", "mixtral-small", "gpt2-small"]:
        attention = "sdpa" if "sdpa" in hf_saved.CASES[name].attentions else "eager"
        dropout = 0.0 if hf_saved.CASES[name].dropout_knobs else None
        for mode in modes:
            fp32_adapters, autocast, _ = LORA_MODES[mode] if mode else (True, False, "")
            for checkpointing in (False, True):
                m = measure(name, args.seq, args.batch, checkpointing, attention, LORA if mode else None, dropout,
                            fp32_adapters, autocast)  # fmt: skip
                ours, phase = lmcalc_peak(name, args.seq, args.batch, checkpointing, attention, mode)
                print(
                    f"| {name} | {mode or 'full'} | {'yes' if checkpointing else 'no'} | {m.peak / 2**20:.3f} | "
                    f"{ours / 2**20:.3f} | {ours / m.peak - 1:+.2%} | {phase} |"
                )


if __name__ == "__main__":
    main()
