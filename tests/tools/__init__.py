"""Tests of the practitioner tools and the command line."""
