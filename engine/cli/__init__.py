"""The command line: python -m engine's commands, Hydra's parser and launcher, sweeps."""
