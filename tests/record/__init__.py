"""Tests of the rank record: dump and load."""
