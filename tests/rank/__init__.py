"""Tests of inside a rank: models, data, probes, parallel wrappers."""
