"""lmcalc from Python: one keyword-only function per command, named like the command, its arguments named like
the command's flags (underscored), each returning an estimate whose figures are typed attributes and whose
``to_dict()`` is the command's ``--json`` document. The command line calls these same functions.

    import lmcalc

    found = lmcalc.plan(model="llama-3-70b", gpus="64x8xH100", seq=8192, global_batch="4M")
    found.best.tp, found.best.time.tokens_per_s   # the fastest layout's TP degree and throughput
    lmcalc.memory(model="llama-3.1-8b", gpus="8xH100", zero=3).total   # bytes on the most loaded GPU

Models, clusters, precision recipes and optimizers are given by name (``"llama-3-70b"``, ``"64x8xH100"``) or as
spec objects (``ModelSpec``, ``Cluster``, …). Bad input raises ``LmcalcError``, whose message names the
argument at fault.
"""

from lmcalc.engine.finetune.method import Method
from lmcalc.engine.finetune.offload import Offload
from lmcalc.engine.memory.gpu_memory import GpuMemory
from lmcalc.engine.parallel.layout import Layout
from lmcalc.engine.parallel.pipeline import PipelineSplit
from lmcalc.engine.workload import Workload
from lmcalc.errors import LmcalcError
from lmcalc.estimates.compare import Comparison, side_by_side
from lmcalc.estimates.counts import FlopsEstimate, ParamsEstimate, TensorEstimate, dtypes, flops, params, tensor
from lmcalc.estimates.inputs import cluster_of, resolve_model
from lmcalc.estimates.layout_settings import LayoutSettings, PinSettings, SearchSettings, SplitSettings
from lmcalc.estimates.limits import FitEstimate, MaxParamsEstimate, fit, max_params
from lmcalc.estimates.memory import MemoryEstimate, MemorySweepEstimate, memory, memory_sweep
from lmcalc.estimates.plan import PlanEstimate, plan
from lmcalc.estimates.report import ReportEstimates, report
from lmcalc.estimates.serving import InferenceEstimate, inference
from lmcalc.estimates.settings import (
    BatchSettings,
    EnergySettings,
    FineTuneSettings,
    MemorySettings,
    MethodSettings,
    OffloadSettings,
    PlanSettings,
    ReportSettings,
    RunSettings,
    ServingSettings,
    TrainingSettings,
    TrainTimeSettings,
    WorkloadSettings,
)
from lmcalc.estimates.shown import Estimate
from lmcalc.estimates.time import OptimalEstimate, TrainTimeEstimate, optimal, train_time
from lmcalc.recipe_specs import OptimizerSpec, PrecisionRecipe
from lmcalc.result import Result
from lmcalc.specs import Cluster, HardwareSpec, ModelSpec

__all__ = [
    "ServingSettings",
    "TrainTimeSettings",
    "WorkloadSettings",
    "SearchSettings",
    "RunSettings",
    "ReportSettings",
    "PlanSettings",
    "PinSettings",
    "EnergySettings",
    "BatchSettings",
    "Cluster",
    "Estimate",
    "FitEstimate",
    "FlopsEstimate",
    "GpuMemory",
    "HardwareSpec",
    "InferenceEstimate",
    "Layout",
    "FineTuneSettings",
    "LayoutSettings",
    "LmcalcError",
    "MaxParamsEstimate",
    "MemoryEstimate",
    "MemorySettings",
    "MemorySweepEstimate",
    "Method",
    "MethodSettings",
    "Comparison",
    "side_by_side",
    "OffloadSettings",
    "ModelSpec",
    "Offload",
    "OptimalEstimate",
    "OptimizerSpec",
    "ParamsEstimate",
    "PipelineSplit",
    "PlanEstimate",
    "PrecisionRecipe",
    "ReportEstimates",
    "Result",
    "SplitSettings",
    "TensorEstimate",
    "TrainTimeEstimate",
    "TrainingSettings",
    "Workload",
    "cluster_of",
    "dtypes",
    "fit",
    "flops",
    "inference",
    "max_params",
    "memory",
    "memory_sweep",
    "optimal",
    "params",
    "plan",
    "report",
    "resolve_model",
    "tensor",
    "train_time",
]
