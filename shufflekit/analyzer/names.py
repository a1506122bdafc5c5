"""The estimators' and targets' names, apart from their numerics (numpy, scipy).

A command line lists them in its `--help` and checks an option against them before any work;
importing this costs nothing, where `analyzer.estimators` loads numpy and scipy.
"""

ESTIMATORS: tuple[str, ...] = ("inv", "clip", "project", "ibu", "mle")
TARGETS: tuple[str, ...] = ("dataset", "population")
