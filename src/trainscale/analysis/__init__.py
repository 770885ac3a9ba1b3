"""Records into tables and figures: tidy rows, tables, figures, the step model,
the reports, the refactoring analysis. Imports no TensorFlow or torch."""
