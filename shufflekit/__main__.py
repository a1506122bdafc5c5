"""`python -m shufflekit`: the command line."""

from shufflekit.app.cli import main

main()
