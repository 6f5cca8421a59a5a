"""Studies of runs: comparisons, sweeps, figures, reports, statistics over seeds and the config
reference. Above ``fedforge.experiment``: a study starts runs and reads their folders; a run
never imports a study."""
