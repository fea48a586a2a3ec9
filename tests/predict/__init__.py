"""Tests of the pure models."""
