"""The reliability battery of issue 13: live servers under fuzzing, hostile input, crashes and load."""
