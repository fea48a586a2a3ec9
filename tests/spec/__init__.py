"""Tests of the spec stage: Experiment, task sections, sealed checkpoints."""
