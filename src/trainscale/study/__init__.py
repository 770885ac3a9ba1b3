"""A study of what the catalogue can run: its config checked, the grid and
its record paths, each job's shape and environment, the study folder, the
schema, the workflow's hooks."""
