"""`python -m shufflekit` runs the command line."""

from shufflekit.cli import main

main()
