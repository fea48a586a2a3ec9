"""nbgrader's configuration for the lab's exercises (run nbgrader from this folder; see exercises/README.md)."""

c = get_config()  # noqa: F821 - nbgrader provides it
c.CourseDirectory.course_id = "ddplab"
c.ExecutePreprocessor.timeout = 300          # a cell may launch ranks: seconds, not nbgrader's 30
c.ExecutePreprocessor.kernel_name = "python3"
# the learner's cells keep the piece's template above the solution, runnable: until its ... are replaced,
# the check says "not filled in yet"
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE: replace each ... above with what you read off the run"}
