"""Tests of tables, plots, claims and checks, on runs and on stand-ins."""
