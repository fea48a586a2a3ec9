"""The spec stage: `Experiment` and its sections, validated and JSON round-tripping (no torch).

    from ddplab.spec import Experiment, Fault, Straggler, AllReduceSweep, BucketSweep, Train, DataCoverage, Resume
Used by every notebook, through `recipes`.
"""

from .coverage import DataCoverage
from .experiment import Experiment
from .fsdp_memory import FsdpMemory
from .fault import Fault
from .link import LINKS, Link
from .pipeline import Pipeline
from .resume import Resume
from .straggler import Straggler
from .tensor_parallel import TensorParallel
from .allreduce_sweep import AllReduceSweep
from .balance import BalanceStudy
from .bucket_sweep import BucketSweep, Plan
from .compression import Compression
from .compiled_ddp import CompiledDdp
from .tasks import Phase, TaskSpec, register
from .train import Train

__all__ = ["AllReduceSweep", "BalanceStudy", "BucketSweep", "Compression", "CompiledDdp", "DataCoverage", "Resume", "Experiment", "Fault", "FsdpMemory", "LINKS", "Link", "Phase", "Pipeline", "Straggler", "TaskSpec", "TensorParallel", "Train", "Plan",
           "register"]
