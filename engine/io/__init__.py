"""Files: H5MD trajectories (writer, reader, salvage), checkpoints, ASE formats, safe writes."""
