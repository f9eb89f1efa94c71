"""Ranks: launching and joining MPI jobs, signals and stops."""
