"""Tests of the notebooks in a browser, the exercise, the cells."""
