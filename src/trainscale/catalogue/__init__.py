"""What can run: every setting declared once, the framework registry, the
launch kinds, the models, what a step moves. The harness, the frameworks and
the launcher read it; a study (trainscale.study) is a grid over it."""
