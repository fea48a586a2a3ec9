"""Tools for a practitioner's own model (`ddplab audit`, `ddplab tune-buckets`, or from Python):

    import ddplab
    report = ddplab.audit_model("mypkg.models:build", world_size=4, optimizer="adam")
    print(report.text())                 # memory per rank, DDP's buckets, ready order, bytes, compute/comm
    tuning = ddplab.tune_buckets("mypkg.models:build", world_size=4)
    tuning.recommendation                # a bucket_cap_mb (or a cap list), with measured step times

The model is a factory (spec/model.py: its contract, with Hugging Face, torchvision and plain
examples). Both tools check it here first (it builds, its logits have the right shape, one backward
reaches every trainable parameter) and refuse it with a ValueError that says what to fix before any
rank starts. `audit.py`: one launch; `bucket_tuning.py`: a capture and a measurement on one set
of warm ranks. Parent side: they launch, then read the runs through the views.
"""

from .audit import ModelAudit, audit_model
from .bucket_tuning import BucketTuning, tune_buckets

__all__ = ["BucketTuning", "ModelAudit", "audit_model", "tune_buckets"]
