"""Tests of one module per task or chapter concept: its runs end to end."""
