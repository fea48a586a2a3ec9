"""nbval runs the learner's notebook here; the instructor's source (with the solution) is executed by
nbgrader's autograde in tests/notebooks/test_exercises.py, not a second time by nbval."""

collect_ignore = ["instructor"]
