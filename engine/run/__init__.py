"""The run loop: a simulation's set-up, steps, observables, reporting, health, restarts."""
