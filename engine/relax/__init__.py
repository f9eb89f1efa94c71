"""Minimisation: FIRE and the cell filter, on the run loop's domains."""
