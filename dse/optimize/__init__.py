"""Optimization: design spaces, exact searches, the solver bridge and result type, and the programs' data."""
