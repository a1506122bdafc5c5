"""What `simulate` and `experiment` offer (datasets, epsilons, readouts, calibrations) and their
defaults, apart from the code that uses them.

The commands' `--help` states these; importing this costs nothing, where `app.datasets` and
`app.experiment` load numpy, scipy and the accountant. Those modules take them from here.
"""

#: The synthetic datasets `make_dataset` builds by name.
DATASETS: tuple[str, ...] = ("normal", "zipf", "uniform")
#: Prefix of a user-given distribution on the command line: ``probs:0.5,0.3,0.2``.
PROBS_PREFIX = "probs:"
#: How far from 1 the numbers after `PROBS_PREFIX` may sum (typed-in decimals such as
#: 0.333,0.333,0.334 must pass); the accepted numbers are then divided by their sum.
PROBS_SUM_TOLERANCE = 1e-3
#: One line for `--help`: every name `make_dataset` accepts.
DATASET_HELP = (
    f"{', '.join(DATASETS)}, or {PROBS_PREFIX}p1,p2,... (a distribution: k >= 2 numbers "
    f">= 0 summing to 1 within {PROBS_SUM_TOLERANCE:g}; k = their count)"
)

DEFAULT_EPSILONS: tuple[float, ...] = (0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)
DEFAULT_REPETITIONS = 100
CENTRAL_READOUTS: tuple[str, ...] = ("raw", "project")
CALIBRATIONS: tuple[str, ...] = ("tight", "composed")
