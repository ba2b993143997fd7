"""Mixed-integer formulations, one module per program; each builds a model and never solves it."""
