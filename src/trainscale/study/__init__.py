"""What a study is: every setting declared once, the framework registry, the
launch kinds, the grid and its record paths, the study folder, the schema."""
