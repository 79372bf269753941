"""The accuracy tasks: quiz and needle (accuracy), golden, fidelity (its served, scored, drift and
verdict parts; the scoring loads the reference runtime), RULER (ruler, its families and
generator)."""
