"""Reports over what was recorded: a trace's (`gpumon analyze`), a job's across daemons or
Prometheus (`gpumon report`), the timeline plot, the ground truth of the bench, and the labeled
corpus the detector is held to."""
