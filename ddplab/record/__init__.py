"""The rank record: what one rank writes to `rank{r}.json` and a notebook reads back (pure: no torch).

One home for every task's data on the reading side, one module per task beside the envelope:

    envelope.py          the file's envelope, `dump`, `load` (typed parsing, errors naming the field)
    timeline.py          events on one time base: readiness, bucket all-reduces, a backward, the exposed tail
    train.py             TrainRecord          allreduce_sweep.py   AllReduceSweepRecord
    bucket_sweep.py      BucketSweepRecord    balance.py           BalanceRecord
    coverage.py          CoverageRecord       fsdp_memory.py       FsdpMemoryRecord
    compression.py       CompressionRecord    compiled_ddp.py      CompiledDdpRecord
    pipeline.py          PipelineRecord       resume.py            ResumeRecord
    tensor_parallel.py   TensorParallelRecord

A task's settings live in `spec/<task>.py`, which names its record class (`TaskSpec.record`); the rank
fills it (`rank/tasks/<task>.py`), `results.load_run` parses it, and the views read it.
"""

from .allreduce_sweep import AllReduceSweepRecord, SizeCalls
from .balance import BalanceArm, BalanceRecord, BalanceStep, CalibrationPoint, CostFit
from .bucket_sweep import BucketSweepRecord, PlanCheck, SweepArm, SweepStep
from .compression import CompressionRecord, HookArm, HookStep, LearnStep
from .compiled_ddp import CompiledArm, CompiledDdpRecord, CompiledStep, SplitBucket
from .coverage import CoverageRecord, EpochBatches
from .envelope import SCHEMA_VERSION, Envelope, RankRecord, RecordError, dump, load, parse
from .fsdp_memory import FsdpConfigRecord, FsdpMemoryRecord, FsdpUnit, MemorySample
from .pipeline import PipelineRecord, PipelineStep, StageOp, UnsplitCheck
from .resume import CheckpointInfo, ResumeRecord, ResumeStep
from .tensor_parallel import Collective, LayerRecord, MeshLayerRecord, StepTimes, TensorParallelRecord
from .timeline import Backward, BucketEvent, ReadyEvent, Timeline, exposed_tail_ms
from .train import (Checksums, Distance, MemoryRecord, MemoryStep, ModelInfo, ProfileRecord, ReferenceRecord,
                    TrainRecord, TrainStep)

__all__ = ["AllReduceSweepRecord", "SizeCalls", "BalanceArm", "BalanceRecord", "BalanceStep",
           "CalibrationPoint", "CostFit", "CompressionRecord", "HookArm", "HookStep", "LearnStep", "CompiledArm", "CompiledDdpRecord", "CompiledStep", "SplitBucket", "BucketSweepRecord", "PlanCheck", "SweepArm", "SweepStep",
           "CoverageRecord", "EpochBatches", "SCHEMA_VERSION", "Envelope", "RankRecord", "RecordError",
           "dump", "load", "parse", "FsdpConfigRecord", "FsdpMemoryRecord", "FsdpUnit", "MemorySample",
           "PipelineRecord", "PipelineStep", "StageOp", "UnsplitCheck", "CheckpointInfo", "ResumeRecord",
           "ResumeStep", "Collective", "LayerRecord", "MeshLayerRecord", "StepTimes",
           "TensorParallelRecord", "Backward", "BucketEvent", "ReadyEvent", "Timeline", "exposed_tail_ms",
           "Checksums", "Distance", "MemoryRecord", "MemoryStep", "ModelInfo", "ProfileRecord",
           "ReferenceRecord", "TrainRecord", "TrainStep"]
