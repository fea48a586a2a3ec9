"""Tests of the launcher: runs, sessions, failures, nodes, %%ddp."""
